#!/usr/bin/env bash
# The GPU path's checks in one go, for a CUDA machine that is lent for minutes (226 seconds of an H200
# for everything): the CUDA tests (Triton kernels compiled for the device, CUDA graphs, autocast), the
# round kernels timed per step, `moglm bench throughput --device cuda` over precisions and batch sizes,
# the torch.profiler profile, dynamic evaluation's cost, and an epoch of the paper's PTB Mogrifier with the
# default settings. Every stage has its own time limit, so that one stuck stage leaves the others' results;
# each writes its log and JSON under $RESULTS (default benchmarks/results/cuda/<gpu>/, e.g. h200), and all of
# them are packed into $OUT/gpu_results.tgz (default OUT: benchmarks/results) after each stage.
#
#   bash benchmarks/gpu_checks.sh                          # everything
#   STAGES="tests round_kernels" bash benchmarks/gpu_checks.sh   # some stages only
#   HIDDEN="650" BATCH="64" PRECISION="fp32 tf32" STAGES=throughput bash benchmarks/gpu_checks.sh  # a smaller grid
#
# Needs: a CUDA build of torch with Triton, and moglm's dependencies importable (pip install -e '.[cli,gpu]',
# or wheels in .whl/ that this installs with --no-index where nothing can be fetched). PTB (for the epoch
# and dynamic evaluation stages) is read from $MOGLM_DATA, or from .devdata/ when that exists.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results}
# the GPU's name as a folder: "NVIDIA H200" -> h200, "NVIDIA H100 80GB HBM3" -> h100-80gb-hbm3
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 | tr '[:upper:] ' '[:lower:]-' \
  | sed 's/^nvidia-//')
R=${RESULTS:-benchmarks/results/cuda/${GPU:-unknown-gpu}}  # relative: the JSON files record their out paths
mkdir -p "$R" "$OUT"
STAGES=${STAGES:-"setup throughput throughput_bf16 dyneval tests profile round_kernels epoch"}
HIDDEN=${HIDDEN:-"650 1500"}
BATCH=${BATCH:-"64 128"}
PRECISION=${PRECISION:-"fp32 tf32"}  # bf16: its own stage, at B = 64
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
[ -d .devdata ] && export MOGLM_DATA=${MOGLM_DATA:-$PWD/.devdata}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi

pack() { tar -czf "$OUT/gpu_results.tgz" -C "$(dirname "$R")" "$(basename "$R")"; }
stage() {  # stage NAME SECONDS COMMAND...: run if asked for, log to $R/NAME.log, report its time and status
  local name=$1 limit=$2; shift 2
  case " $STAGES " in *" $name "*) ;; *) return 0 ;; esac
  local start=$SECONDS
  echo "== $name (limit ${limit}s)"
  timeout -k 5 "$limit" "$@" >"$R/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc=$rc in $((SECONDS - start))s"
  tail -n 30 "$R/$name.log"
  pack
}
flags() { local f=$1; shift; for v in "$@"; do printf ' %s %s' "$f" "$v"; done; }

MODELS=(--model torch.nn.LSTM --model "LSTM, CUDA graphs" --model "Mogrifier, CUDA graphs"
        --model "multiplicative LSTM, CUDA graphs" --model "Mogrifier, CUDA graphs, step kernels")
stage setup 20 bash -c 'nvidia-smi; python3 -c "import torch, triton; print(torch.__version__, triton.__version__,
  torch.version.cuda, torch.cuda.get_device_name(), torch.backends.cudnn.version())"; python3 -c "import moglm.cli"'
# shellcheck disable=SC2046
stage throughput 150 python3 -m moglm bench throughput --device cuda $(flags --hidden-size $HIDDEN) \
  $(flags --batch-size $BATCH) $(flags --precision $PRECISION) "${MODELS[@]}" --repeats 3 --epoch-steps 0 \
  --out "$R/throughput_cuda.json"
# shellcheck disable=SC2046
stage throughput_bf16 60 python3 -m moglm bench throughput --device cuda $(flags --hidden-size $HIDDEN) \
  --batch-size 64 --precision bf16 "${MODELS[@]}" --repeats 3 --epoch-steps 0 --out "$R/throughput_cuda_bf16.json"
stage dyneval 90 python3 benchmarks/dyneval_cost.py --device cuda --tokens 3000 --profile 400 \
  --out "$R/dyneval_cost_cuda.json"
stage tests 170 python3 -m pytest -q -p no:cacheprovider --timeout 60 tests/recurrence/test_recurrence_cuda.py \
  tests/recurrence/test_recurrence_cuda_graphs.py -k "not papers_sizes or zigzag-tf32"
stage profile 40 python3 benchmarks/profile_fused.py --device cuda --hidden-size 650 --batch-size 64 --passes 3 \
  --precision tf32 --models "Mogrifier, CUDA graphs" "Mogrifier, CUDA graphs, step kernels" \
  --out "$R/profile_fused_cuda.json"
stage round_kernels 45 python3 benchmarks/round_kernels.py --precision tf32 --out "$R/round_kernels_cuda.json"
stage epoch 60 python3 -m moglm bench epoch ptb-word-mogrifier-paper --device cuda --steps 30 \
  --out "$R/epoch_cuda.json"
echo "== done"
