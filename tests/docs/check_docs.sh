#!/usr/bin/env bash
# The documentation holds together: README.md is the door to docs/, and nothing it promises is
# lost between the pages.
#   - every relative link in README.md and docs/*.md names a file that exists, and its #anchor a
#     heading of that file (GitHub's slugs);
#   - README.md links every page of docs/;
#   - docs/config.md names every key of proto/config.proto;
#   - the test command the README gives is the one .ci/run runs.
#   check_docs.sh ROOT
set -euo pipefail
root="${1:?usage: check_docs.sh ROOT}"
cd "$root"
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# The anchors of FILE's headings, one a line, as GitHub makes them: lowercase, punctuation other
# than '-' and '_' dropped, spaces as '-', a repeated slug numbered -1, -2, ... Lines inside
# code fences are not headings.
anchors() {
  awk '
    /^```/ { fenced = !fenced; next }
    fenced { next }
    /^#+ / {
      slug = tolower($0)
      sub(/^#+ /, "", slug)
      gsub(/[^a-z0-9 _-]/, "", slug)
      gsub(/ /, "-", slug)
      if (slug in seen) { seen[slug]++; print slug "-" seen[slug] } else { seen[slug] = 0; print slug }
    }' "$1"
}

# Links [text](target) outside code fences and inline code, one "target" a line.
links() {
  awk '
    /^```/ { fenced = !fenced; next }
    fenced { next }
    {
      line = $0
      gsub(/`[^`]*`/, "", line)
      while (match(line, /\]\([^) ]+\)/)) {
        print substr(line, RSTART + 2, RLENGTH - 3)
        line = substr(line, RSTART + RLENGTH)
      }
    }' "$1"
}

pages=(README.md docs/*.md)
for page in "${pages[@]}"; do
  dir="$(dirname "$page")"
  while IFS= read -r target; do
    case "$target" in
      http://* | https://* | mailto:*) continue ;;
    esac
    file="${target%%#*}"
    anchor=""
    [[ "$target" == *"#"* ]] && anchor="${target#*#}"
    if [ -z "$file" ]; then
      resolved="$page"
    else
      resolved="$dir/$file"
    fi
    if [ ! -e "$resolved" ]; then
      fail "$page links '$target': $resolved does not exist"
      continue
    fi
    if [ -n "$anchor" ]; then
      if [[ "$resolved" != *.md ]] || ! anchors "$resolved" | grep -qxF "$anchor"; then
        fail "$page links '$target': $resolved has no heading with the anchor '#$anchor'"
      fi
    fi
  done < <(links "$page")
done

for doc in docs/*.md; do
  links README.md | grep -qxF "$doc" || fail "README.md does not link $doc"
done

# Field names of the config schema (lowercase names; message and enum names are capitalized).
keys="$(sed -nE 's/^[[:space:]]*(optional[[:space:]]+|repeated[[:space:]]+)?[A-Za-z0-9_.]+[[:space:]]+([a-z][a-z0-9_]*)[[:space:]]*=[[:space:]]*[0-9]+.*;.*$/\2/p' \
  proto/config.proto | sort -u)"
[ -n "$keys" ] || fail "no keys found in proto/config.proto"
for key in $keys; do
  # In backticks, alone or as a part of a dotted path: `key`, `section.key`, `key.sub`.
  grep -qE "[\`.]${key}[\`.]" docs/config.md || fail "docs/config.md does not document the config key '$key'"
done

ci_command="$(grep -E '^bash scripts/test\.sh' .ci/run | head -n 1)"
[ -n "$ci_command" ] || fail ".ci/run does not run bash scripts/test.sh"
grep -qF "$ci_command" README.md || fail "README.md does not give .ci/run's test command '$ci_command'"

if [ "$failures" -gt 0 ]; then
  echo "$failures problem(s) in the documentation"
  exit 1
fi
echo "docs: ${#pages[@]} pages, links, config keys and the test command check out"
