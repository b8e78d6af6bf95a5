"""TensorBoard's own reader on a zero-train run's event file (the `tensorboard` package, which
scripts/setup.sh installs in a virtual environment; without it this skips with exit code 77,
CTest's SKIP_RETURN_CODE): every step's train_loss equals the metrics file's loss as
a float, bit for bit, at DeepSpeed's samples seen; and a copy with one byte flipped in its last
record loses that record to the reader's CRC check, the records before it read.

usage: tensorboard_read.py METRICS TENSORBOARD_DIR BATCH SCRATCH_DIR"""
import glob
import json
import os
import shutil
import struct
import sys

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
except ImportError as error:
    print(f"skipping: {sys.executable} has no tensorboard package ({error}); scripts/setup.sh "
          "installs it in a virtual environment that CMake then finds")
    sys.exit(77)


def main():
    metrics, log_dir, batch, scratch = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    steps = [json.loads(line) for line in open(metrics)]
    steps = [r for r in steps if r.get("event") == "step"]
    accumulator = EventAccumulator(log_dir)
    accumulator.Reload()
    losses = accumulator.Scalars("Train/Samples/train_loss")
    assert len(losses) == len(steps), (len(losses), len(steps))
    for event, record in zip(losses, steps):
        expected = struct.unpack("f", struct.pack("f", record["loss"]))[0]
        assert event.step == (record["step"] - 1) * batch, (event.step, record["step"])
        assert event.value == expected, (record["step"], event.value, expected)

    (path,) = glob.glob(os.path.join(log_dir, "events.out.tfevents.*"))
    records = list(RawEventFileLoader(path).Load())
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    corrupt = os.path.join(scratch, os.path.basename(path))
    data = bytearray(open(path, "rb").read())
    data[len(data) - 4 - len(records[-1]) + 2] ^= 0x01
    open(corrupt, "wb").write(bytes(data))
    survivors = list(RawEventFileLoader(corrupt).Load())
    assert survivors == records[:-1], (len(survivors), len(records))
    print(f"tensorboard_read: {len(steps)} losses agree bit for bit; the flipped record is refused")


main()
