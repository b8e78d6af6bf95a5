// Fuzz target: zerorun's hostfile parser, and the mpirun command built from the hosts it
// returns (what zerorun --hostfile does before it starts anything). HostfileError is the
// documented answer to a bad hostfile; anything else is a bug. Hosts that parse must be usable:
// a name mpirun's --host list can carry, at least one slot each, each host once.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "zero/launcher/launch_command.h"

namespace {

using zero::launcher::HostfileError;
using zero::launcher::HostSlots;

void check_hosts(const std::vector<HostSlots>& hosts) {
  std::set<std::string> seen;
  if (hosts.empty()) std::abort();
  for (const HostSlots& entry : hosts) {
    const bool usable_name = !entry.host.empty() &&
                             entry.host.find_first_of(",:#= \t\r\n") == std::string::npos &&
                             seen.insert(entry.host).second;
    if (!usable_name || entry.slots < 1) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<HostSlots> hosts;
  try {
    hosts = zero::launcher::parse_hostfile(text, "fuzz_hosts");
  } catch (const HostfileError&) {
    return 0;
  }
  check_hosts(hosts);

  // Every slot (no -np), then with --num_gpus capping each host, as zerorun would run them.
  // No exception is expected: the one documented, "-np exceeds the slots", cannot happen here.
  // The command's -np must be the slots counted in 64 bits: a sum that wrapped shows even in a
  // build without UBSan.
  zero::launcher::LaunchRequest request;
  request.hostfile = "fuzz_hosts";
  request.program = {"train"};
  const zero::launcher::HostFacts facts;
  for (int num_gpus : {0, 2}) {
    request.num_gpus = num_gpus;
    long total_slots = 0;
    for (const HostSlots& entry : hosts) {
      total_slots += num_gpus > 0 ? std::min(entry.slots, num_gpus) : entry.slots;
    }
    const std::vector<std::string> command =
        zero::launcher::build_mpirun_command("mpirun", request, facts, hosts);
    if (command.size() < 3 || command[1] != "-np" || command[2] != std::to_string(total_slots)) {
      std::abort();
    }
  }
  return 0;
}
