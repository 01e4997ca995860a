#!/usr/bin/env bash
# Evaluate every checkpoint of a directory in one pass and pick the best one.
#
#   examples/pick_best.sh DATA CHECKPOINT_DIR [ESTIMATOR]
#
# stdout: the best checkpoint's path (so `best=$(examples/pick_best.sh ...)` works);
# stderr: every checkpoint ranked by ESTIMATOR (default wis), with its interval.
# The JSON document of `ope evaluate --format json` is picked apart with jq when it is
# installed, else with Python's json module (set USE_JQ=0 to force Python).
#
# Try it on a synthetic dataset whose true values are known (truth.json):
#   ope generate bandit demo --episodes 5000 && examples/pick_best.sh demo/logs.parquet demo/policies
# or on the shipped example:
#   examples/pick_best.sh examples/data/logs.parquet examples/policies
set -euo pipefail

if [[ $# -lt 2 || $# -gt 3 ]]; then
  echo "usage: $0 DATA CHECKPOINT_DIR [ESTIMATOR]" >&2
  exit 2
fi
data=$1
dir=$2
estimator=${3:-wis}
estimator=$(printf '%s' "$estimator" | tr '[:upper:]' '[:lower:]')  # as ope reads it: WIS is wis
ope=${OPE:-ope}  # the ope command, e.g. OPE=.venv/bin/ope

shopt -s nullglob
checkpoints=("$dir"/*.npz)
if [[ ${#checkpoints[@]} -eq 0 ]]; then
  echo "$0: no .npz checkpoints in $dir" >&2
  exit 2
fi
args=()
for checkpoint in "${checkpoints[@]}"; do
  args+=(--policy "$checkpoint")
done

# One pass over the data for all checkpoints; stdout carries exactly one JSON document.
json=$($ope evaluate "$data" "${args[@]}" --estimator "$estimator" --format json --quiet)

if command -v jq >/dev/null 2>&1 && [[ ${USE_JQ:-1} != 0 ]]; then
  ranked=$(jq -r --arg e "$estimator" '
    .results
    | map(select(.estimates[$e].value != null))
    | sort_by(-.estimates[$e].value)
    | .[]
    | "\(.policy)\t\(.estimates[$e].value)\t\(.estimates[$e].ci_low)\t\(.estimates[$e].ci_high)"
  ' <<<"$json")
else
  ranked=$(${PYTHON:-python3} -c '
import json, sys
estimator = sys.argv[1]
results = [r for r in json.load(sys.stdin)["results"] if r["estimates"][estimator]["value"] is not None]
for r in sorted(results, key=lambda r: -r["estimates"][estimator]["value"]):
    e = r["estimates"][estimator]
    print("\t".join([r["policy"], *(json.dumps(e[k]) for k in ("value", "ci_low", "ci_high"))]))
' "$estimator" <<<"$json")
fi

if [[ -z $ranked ]]; then
  echo "$0: no checkpoint has a defined $estimator estimate" >&2
  exit 1
fi
number() { if [[ $1 == null ]]; then echo n/a; else printf '%.4g' "$1"; fi; }
echo "ranked by $estimator: value [interval] checkpoint" >&2
while IFS=$'\t' read -r policy value low high; do
  printf '  %10.4g  [%s, %s]  %s\n' "$value" "$(number "$low")" "$(number "$high")" "$policy" >&2
done <<<"$ranked"
head -n 1 <<<"$ranked" | cut -f 1
