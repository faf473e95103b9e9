#!/usr/bin/env bash
# The TPU path (trainer=xla) run once on the CPU through XLA (PJRT_DEVICE=CPU), in an environment of its own
# (torch_xla's newest release is built for torch 2.9, not the 2.13 the project pins), and its loss compared with
# the same job on the plain CPU. Not part of CI. Usage: bash benchmarks/xla_cpu.sh [work dir]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK="${1:-/tmp/nas-xla}"
mkdir -p "$WORK"
if [ ! -x "$WORK/venv/bin/python" ]; then
  python3 -m venv "$WORK/venv"
  "$WORK/venv/bin/pip" install -q "torch==2.9.0" "torch_xla==2.9.0"
  "$WORK/venv/bin/pip" install -q -e "$ROOT"
fi
. "$WORK/venv/bin/activate"
python -c "import torch, torch_xla; print('torch', torch.__version__, 'torch_xla', torch_xla.__version__)"
COMMON=(debug=fast progress_bar=false logger=csv trainer.max_steps=20 trainer.val_check_interval=10 threads=1 seed=1
        trainer.precision=32-true diagnostics.enabled=false)
cd "$WORK"
rm -rf xla cpu
PJRT_DEVICE=CPU nas-run "${COMMON[@]}" trainer=xla trainer.devices=1 hydra.run.dir=xla > xla.log 2>&1 || { tail -30 xla.log; exit 1; }
nas-run "${COMMON[@]}" trainer=cpu hydra.run.dir=cpu > cpu.log 2>&1 || { tail -30 cpu.log; exit 1; }
python - <<'PY'
import json
x, c = (json.load(open(f"{d}/summary.json")) for d in ("xla", "cpu"))
for k in ("test/loss", "test/exact_match", "test/bleu"):
    print(f"{k}: xla {x['test'][k]:.6f}  cpu {c['test'][k]:.6f}  diff {x['test'][k] - c['test'][k]:+.2e}")
print("xla environment:", x.get("environment"))
PY
