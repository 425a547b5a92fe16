#!/usr/bin/env bash
# On a machine with a CUDA GPU: the probe and the trace against a real CUDA build of PyTorch.
#   bash benchmarks/cuda/check.sh OUTDIR
# 1. `amplint probe --device cuda` (auto mode executes every op on the GPU) and its diff against
#    the committed cuda table; 2. the cuDNN RNN kernel the committed table adds from source
#    (`_cudnn_rnn`), executed; 3. `amplint trace` of fixtures/{faulty,correct}/train_amp.py on
#    the GPU, beside `amplint check` of the same files.
set -uo pipefail
out=${1:?give an output folder}
mkdir -p "$out"
root=$(cd "$(dirname "$0")/../.." && pwd)
amplint="python3 -m amplint"
cd "$root"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())'
} > "$out/device.txt" 2>&1
cat "$out/device.txt"

$amplint probe --device cuda --format json -o "$out/cuda.json" > "$out/probe.log" 2>&1
echo "probe exit $?" | tee -a "$out/probe.log"
$amplint probe diff policies/torch-2.13/cuda.json "$out/cuda.json" > "$out/diff.txt" 2>&1
echo "diff exit $?"; head -c 3000 "$out/diff.txt"

$amplint probe --device cuda --mode execute --ops _cudnn_rnn --format json -o "$out/cudnn_rnn.json" > "$out/cudnn_rnn.log" 2>&1
echo "cudnn_rnn exit $?"; tail -5 "$out/cudnn_rnn.log"

for kind in faulty correct; do
  work=$(mktemp -d); cp fixtures/$kind/*.py "$work/"
  (cd "$work" && python3 -c '
import torch
torch.save([(torch.randn(3, 16, 16), int(i % 10)) for i in range(512)], "train.pt")
torch.save([(torch.randn(3, 16, 16), int(i % 10)) for i in range(256)], "val.pt")')
  (cd "$work" && PYTHONPATH="$root:${PYTHONPATH:-}" timeout 240 python3 -m amplint.trace --steps 4 \
      --output-format json -- python train_amp.py --epochs 1) > "$out/trace-$kind.json" 2> "$out/trace-$kind.log"
  echo "trace $kind exit $?"; tail -3 "$out/trace-$kind.log"
  $amplint check --no-cache --exit-zero --output-format concise fixtures/$kind/train_amp.py > "$out/check-$kind.txt" 2>&1
done
python3 - "$out" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
for kind in ("faulty", "correct"):
    try:
        found = json.loads((out / f"trace-{kind}.json").read_text() or "[]")
    except ValueError as exc:
        print(kind, "trace output is not JSON:", exc); continue
    print(f"trace {kind}:", sorted((d["code"], d["location"]["row"]) for d in found if "train_amp" in d["filename"]))
    print(f"check {kind}:", (out / f"check-{kind}.txt").read_text().strip().splitlines())
PY
