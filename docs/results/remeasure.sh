#!/usr/bin/env bash
# Re-run every README figure that depends on the micro model's skill, on one model folder.
#
#   bash docs/results/remeasure.sh [-n] [MODEL_DIR] [OUT_DIR]
#
# -n prints the commands, in lane order, instead of running them. ONLY=name,name (the names -n
# prints) runs those steps alone, to re-measure one figure.
# MODEL_DIR defaults to the shipped model (whale_lab/micro/model); OUT_DIR to
# runs/remeasure-<date>. Two lanes run side by side, one torch thread each (the README's numbers
# come from a 2-core machine run this way); the timings the README gives beside them add up to
# about two hours on that machine. Every command is the one the README gives beside its figure,
# with the model folder set by `--set model.path=`. Each writes its log (and, where it has one,
# its JSON) under OUT_DIR; `OUT_DIR/failed` lists any command that did not exit 0, and the script
# then exits 1. Copying the compare reports into docs/results/<name>/ and the figures into the
# README is left to the reader of the logs.
set -uo pipefail
cd "$(dirname "$0")/../.."
dry=0
if [[ "${1:-}" == "-n" ]]; then
    dry=1
    shift
fi

model=$(realpath "${1:-whale_lab/micro/model}")
out=${2:-runs/remeasure-$(date +%Y%m%d-%H%M)}
if [[ ! -f "$model/config.json" ]]; then
    echo "remeasure: $model: no config.json, not a model folder" >&2
    exit 2
fi
((dry)) || mkdir -p "$out"
out=$(realpath -m "$out")
wl=(.venv/bin/whale-lab --set "model.path=\"$model\"" --set "run.directory=\"$out/runs\"")
export OMP_NUM_THREADS=1
((dry)) || : > "$out/failed"

# wanted NAME: the step is among ONLY's names, or ONLY is unset.
wanted() { [[ -z "${ONLY:-}" || ",$ONLY," == *",$1,"* ]]; }

# step NAME COMMAND...: run one command, its output in OUT/NAME.log, a failure noted and survived.
step() {
    local name=$1
    shift
    wanted "$name" || return 0
    if ((dry)); then
        echo "$name: $*"
        return
    fi
    echo "$(date +%H:%M:%S) start $name"
    if "$@" > "$out/$name.log" 2>&1; then
        echo "$(date +%H:%M:%S) done  $name"
    else
        echo "$name (exit $?): $*" >> "$out/failed"
        echo "$(date +%H:%M:%S) FAIL  $name (see $out/$name.log)"
    fi
}

# calibrate DOMAIN SUFFIX OPTIONS: OPTIONS unquoted, so that it splits into its words.
calibrate() { step "calibrate-$1$2" "${wl[@]}" micro calibrate --domain "$1" --tasks 128 --k 8 \
    $3 --json "$out/calibrate-$1$2.json"; }

compare() {  # compare NAME CONFIG DOMAIN SCHEDULES
    step "compare-$1" "${wl[@]}" compare --config "docs/results/$2" --domain "$3" \
        --out "$out/compare-$1" --schedules "$4" --seeds 0,1,2
}

all7=whale,adaptive,weight-only,harness-only,stagewise,prompt-only,best-of-n
five=whale,harness-only,stagewise,weight-only,best-of-n

lane_a() {
    calibrate chess "" "--rsft-epochs 1"
    calibrate chess -variants --chess-variants
    for h in h0 calibration_strong; do
        step "chess-harness-split-$h" "${wl[@]}" --set domain.splits.harness=256 eval \
            --domain chess --split harness --harness "harnesses/chess/$h.py" --k 8 --json
    done
    compare search compare.toml search "$all7"
    compare search-h64 compare-h64.toml search "$five"
    compare chess compare-chess.toml chess "$five"
}

lane_b() {
    calibrate math "" "--rsft-epochs 1"
    calibrate search "" "--rsft-epochs 1"
    calibrate math -held-out "--rsft-epochs 1 --held-out"
    calibrate search -held-out "--rsft-epochs 1 --held-out"
    for d in math search chess; do
        step "eval-val-$d" "${wl[@]}" eval --domain "$d" --split val --k 8 --json
    done
    step train-math "${wl[@]}" train --domain math
    step search-search "${wl[@]}" search --domain search --set 'approval.mode="auto"' \
        --set harness_search.iterations=3
    step probe-math "${wl[@]}" probe --domain math --set domain.splits.val=24 \
        --set domain.splits.harness=16 --set sampling.k=4 --json
    compare math compare.toml math "$all7"
    compare search-12 compare-12.toml search whale,weight-only,harness-only,stagewise,best-of-n
}

if ((dry)); then
    lane_a
    lane_b
else
    lane_a &
    lane_b &
    wait
fi

# The interaction probes read the whale runs of seed 0, on copies (a probe writes into its run).
for d in search math; do
    wanted "interaction-$d" || continue
    if ((dry)) || [[ -d "$out/compare-$d/whale-seed0" ]]; then
        ((dry)) || rm -rf "$out/interaction-$d"
        ((dry)) || cp -r "$out/compare-$d/whale-seed0" "$out/interaction-$d"
        step "interaction-$d" "${wl[@]}" probe --interaction --run "$out/interaction-$d" --json
    else
        echo "interaction-$d: no run $out/compare-$d/whale-seed0 to probe" >> "$out/failed"
    fi
done

if ((dry)); then
    exit 0
fi
if [[ -s "$out/failed" ]]; then
    echo "remeasure: $(wc -l < "$out/failed") command(s) failed, listed in $out/failed" >&2
    exit 1
fi
echo "remeasure: every command done; logs and JSON in $out"
