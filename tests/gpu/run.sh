#!/usr/bin/env bash
# Everything that needs a GPU: NVSHMEM backend, NVSHMEM device functions from Triton,
# tilelink.language across ranks, and the putmem_signal probe. Run from the repo root:
#   bash tests/gpu/run.sh            (logs in $OUT, default /tmp/tilelink-gpu)
# Wheels the machine lacks (nvshmem4py-cu13, libcst) are taken from .whl/ when present.
set -u
cd "$(dirname "$0")/../.."
REPO=$PWD
OUT=${OUT:-/tmp/tilelink-gpu}
mkdir -p "$OUT"
# never NVLink multicast on a shared host: it can take the host's GPUs out of service
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export PYTHONUNBUFFERED=1

SITE=/tmp/site
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" .whl/*.whl || exit 1
fi
# tilelink without installing it: the package-dir mapping of pyproject.toml, as symlinks
SHIM=/tmp/tilelink-shim
rm -rf "$SHIM" && mkdir -p "$SHIM/tilelink"
for f in "$REPO"/tlxform/*; do ln -s "$f" "$SHIM/tilelink/"; done
for sub in rules runtime cli ops benchmarks; do
    [ -d "$REPO/$sub" ] && ln -sfn "$REPO/$sub" "$SHIM/tilelink/$sub"
done
export PYTHONPATH="$SITE:$SHIM${PYTHONPATH:+:$PYTHONPATH}"

{
    echo "== environment"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 - <<'PY'
import importlib.metadata as md
for name in ("torch", "triton", "nvshmem4py-cu13", "nvidia-nvshmem-cu13", "cuda-core", "cuda-bindings",
             "cuda-pathfinder", "libcst"):
    try:
        print(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name} MISSING")
import nvshmem.core, nvshmem.bindings as b
print("bitcode", nvshmem.core.find_device_bitcode_library())
print("SIGNAL_SET", int(b.Signal_op.SIGNAL_SET), "SIGNAL_ADD", int(b.Signal_op.SIGNAL_ADD), "CMP_GE", int(b.Cmp_type.CMP_GE))
import tilelink.runtime.nvshmem, tilelink.runtime.nvshmem_device
print("tilelink imports ok")
PY
    inc=$(python3 -c "from cuda.pathfinder import find_nvidia_header_directory as f; print(f('nvshmem'))" 2>/dev/null)
    grep -rhn "NVSHMEM_SIGNAL_SET = " "$inc" 2>/dev/null | head -2
} 2>&1 | tee "$OUT/env.log"

# most important first: the backend, NVSHMEM from Triton (with the putmem_signal regression test),
# the putmem_signal probe, then tilelink.language across ranks and the operators (AG+GEMM, GEMM+RS,
# MoE, SP attention, the decoder models, two process groups of a job) on several ranks sharing the GPU
FIRST=${GPU_TESTS_FIRST-tests/gpu/test_nvshmem_backend.py tests/gpu/test_nvshmem_device.py}
THEN=${GPU_TESTS_THEN-tests/gpu/test_language_nvshmem.py tests/gpu/test_partners_gpu.py tests/gpu/test_ops_nvshmem.py tests/gpu/test_moe_gpu.py tests/gpu/test_attention_gpu.py tests/gpu/test_models_gpu.py tests/gpu/test_groups_gpu.py}
status=0
: > "$OUT/gpu.log"
if [ -n "$FIRST" ]; then
    timeout "${GPU_TEST_TIMEOUT:-900}" python3 -m pytest -p no:cacheprovider -v -rA -s $FIRST 2>&1 | tee -a "$OUT/gpu.log"
    status=${PIPESTATUS[0]}
fi
if [ "${GPU_PROBE:-1}" = 1 ]; then
    (cd tests/gpu && timeout "${PROBE_TIMEOUT:-300}" python3 probe_putmem_signal.py "${PROBE_WORLD:-4}") 2>&1 \
        | tee "$OUT/putmem_probe.log"
fi
if [ -n "$THEN" ]; then
    timeout "${GPU_TEST_TIMEOUT:-900}" python3 -m pytest -p no:cacheprovider -v -rA -s $THEN 2>&1 | tee -a "$OUT/gpu.log"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
exit "$status"
