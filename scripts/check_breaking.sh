#!/usr/bin/env bash
# Fails when the quarry.v1 contracts break compatibility (buf's PACKAGE rules: wire, JSON and
# generated source) with the committed baseline image, except for the deliberate breaks listed in
# protos/baseline/allowed-breaks.txt. A listed break that no longer occurs fails too, so the list
# stays exact. Moving the baseline: rebuild the image from the new release's protos/ with
#   (cd protos && buf build --exclude-source-info -o baseline/quarry-v1.binpb)
# and empty the allow-list. The image is a committed file, so no git history is needed.
set -euo pipefail
cd "$(dirname "$0")/../protos"

baseline=baseline/quarry-v1.binpb
allowed=baseline/allowed-breaks.txt

# buf exits 100 when it found breaks, anything else non-zero when it could not check.
status=0
findings=$(buf breaking --path quarry --against "$baseline" --error-format json) || status=$?
if [ "$status" -ne 0 ] && [ "$status" -ne 100 ]; then
  echo "buf breaking could not compare against $baseline (exit $status)" >&2
  exit "$status"
fi

# One line per finding, "RULE: message", without file positions so that edits elsewhere in a
# file do not invalidate the allow-list.
FINDINGS="$findings" python3 - "$allowed" <<'EOF'
import json
import os
import sys

allowed_path = sys.argv[1]
found = {
    f"{finding['type']}: {finding['message']}"
    for finding in map(json.loads, os.environ["FINDINGS"].splitlines())
}
with open(allowed_path, encoding="utf-8") as allowed_file:
    lines = (line.strip() for line in allowed_file)
    allowed = {line for line in lines if line and not line.startswith("#")}

unexpected = sorted(found - allowed)
stale = sorted(allowed - found)
for line in unexpected:
    print(f"breaking change not in {allowed_path}: {line}", file=sys.stderr)
for line in stale:
    print(f"listed in {allowed_path} but no longer found (remove it): {line}", file=sys.stderr)
if unexpected or stale:
    sys.exit(1)
print(f"buf breaking: {len(found)} deliberate break(s), all listed in {allowed_path}")
EOF
