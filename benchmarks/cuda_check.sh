#!/bin/bash
# What needs a CUDA GPU, in one run (from the repository's root, on a machine with one and a
# CUDA build of torch; amplint itself is taken from this tree):
#   1. the probe's CUDA table observed at the dispatcher (`--mode simulate`, what it does
#      without a GPU) against the one from ops executed on the GPU (`--mode execute`), and the
#      committed table against the executed one (`amplint probe diff`);
#   2. the cuDNN RNN kernel (`_cudnn_rnn`, which the committed table takes from PyTorch's
#      source) executed on its own;
#   3. `amplint trace` of the fixtures' training script on the GPU beside `amplint check` of the
#      same file: the faulty one must report its mistakes, the correct one nothing;
#   4. the same of the fixtures' other trainers, driven by benchmarks/cuda_fixtures.py.
# Everything it writes goes to $OUT (default: a new temporary folder, printed first).
#
#     OUT=/tmp/cuda-check bash benchmarks/cuda_check.sh
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$(mktemp -d)}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
echo "writing to $OUT"
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1

nvidia-smi -L
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())" \
    | tee "$OUT/torch.txt"

for mode in simulate execute; do
    TIMEFORMAT="probe --mode $mode: %R s"
    time $PY -m amplint probe --device cuda --mode $mode --format json -o "$OUT/cuda-$mode.json"
done
$PY -m amplint probe diff "$OUT/cuda-simulate.json" "$OUT/cuda-execute.json" > "$OUT/diff-simulate-execute.txt"
echo "simulate vs execute: $(tail -1 "$OUT/diff-simulate-execute.txt")"
$PY -m amplint probe diff "$ROOT/policies/torch-2.13/cuda.json" "$OUT/cuda-execute.json" > "$OUT/diff-committed-execute.txt"
echo "committed (torch 2.13, simulated) vs execute: $(tail -1 "$OUT/diff-committed-execute.txt")"

$PY -m amplint probe --device cuda --mode execute --ops _cudnn_rnn --format json -o "$OUT/cudnn-rnn.json" \
    > "$OUT/cudnn-rnn.log" 2>&1
echo "_cudnn_rnn executed: rc $?, $(tail -1 "$OUT/cudnn-rnn.log")"

# The fixtures' training script reads its data from train.pt and val.pt: random images.
for kind in faulty correct; do
    work=$(mktemp -d)
    cp "$ROOT"/fixtures/$kind/*.py "$work"/
    (cd "$work" && $PY -c "
import torch
torch.manual_seed(0)
for name, n in (('train.pt', 512), ('val.pt', 256)):
    torch.save([(torch.randn(3, 32, 32), int(torch.randint(0, 10, ()))) for _ in range(n)], name)
")
    (cd "$work" && timeout 300 $PY -m amplint trace --steps 3 --output-format json --report "$OUT/trace-$kind.json" \
        -- python train_amp.py --epochs 1 > "$OUT/trace-$kind-findings.json" 2> "$OUT/trace-$kind.err")
    echo "trace $kind/train_amp.py: rc $?, findings: $($PY -c "
import json, sys
found = json.load(open(sys.argv[1]))
print(len(found), sorted({(f['code'], f['location']['row']) for f in found}))" "$OUT/trace-$kind-findings.json" 2>&1)"
    rm -rf "$work"
    echo "check $kind/train_amp.py: $($PY -m amplint check --no-cache --exit-zero --output-format concise \
        "$ROOT/fixtures/$kind/train_amp.py" | tr '\n' ' ')"
done

for kind in faulty correct; do
    (cd "$ROOT" && timeout 300 $PY -m amplint trace --steps 0 --output-format json \
        -- python benchmarks/cuda_fixtures.py $kind > "$OUT/fixtures-$kind.json" 2> "$OUT/fixtures-$kind.err")
    echo "trace of $kind trainers: rc $?; $(grep -E '^[A-Za-z_.]+( [a-z_]+)?: ' "$OUT/fixtures-$kind.err" | tr '\n' ';')"
    $PY - "$OUT/fixtures-$kind.json" <<'PY'
import json, sys
from pathlib import Path
found = json.load(open(sys.argv[1]))
print("  traced:", sorted((f["code"], Path(f["filename"]).name, f["location"]["row"]) for f in found))
PY
    echo "  checked: $($PY -m amplint check --no-cache --exit-zero --output-format concise \
        "$ROOT"/fixtures/$kind/{gan_trainer,legacy_trainer,segmentation_fp16,amp_recipes}.py 2>/dev/null \
        | grep -oE '[a-z_0-9]+\.py:[0-9]+:[0-9]+: AMP[0-9]+' | tr '\n' ' ')"
done
