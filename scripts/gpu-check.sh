#!/usr/bin/env bash
# The checks that mean anything only on a real GPU (issue 42), as one run on a lent GPU machine:
# the raw nvidia-smi outputs (fixtures), `envbuild detect`, `resolve --host`, the smoke test at
# its tiers (in-process and as the images' zipapp; cold compiler caches), nvidia-smi samples of an
# idle and a busy GPU, and bench/bench_diagnose_gpu.py (three real training jobs, bare and under
# `envbuild diagnose`).
#
#   OUT=DIR bash scripts/gpu-check.sh      # from the checkout's root, with a CUDA torch on python3
#
# Everything lands in DIR: log.txt (this run's output, as it goes) and gpu-check.tar.gz (every
# file, packed again after each step, so a run cut short still brings back what it made).
# No step stops the others; each has a time limit, and steps.tsv lists each one's exit and time.
# Needs: python3 with torch (CUDA) and jinja2, pyyaml, requests, packaging; nvidia-smi.
set -u
OUT=${OUT:-/tmp/gpu-check}
PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}  # cpu: try the plumbing on a machine without a GPU (figures meaningless)
mkdir -p "$OUT"
W=$(mktemp -d /tmp/gpu-check.XXXXXX)
mkdir -p "$W/smi" "$W/detect" "$W/smoke" "$W/resolve" "$W/cache"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
exec > >(tee -a "$OUT/log.txt") 2>&1

pack() { tar czf "$OUT/gpu-check.tar.gz.tmp" --exclude=./cache -C "$W" . && mv "$OUT/gpu-check.tar.gz.tmp" "$OUT/gpu-check.tar.gz"; }

# step NAME LIMIT_S SCRIPT: run the bash SCRIPT with a time limit, log its exit code and seconds
step() {
    local name=$1 limit=$2 script=$3
    echo "=== $name ($(date -u +%T)): $script"
    local t0 t1 rc
    t0=$(date +%s.%N)
    timeout -k 5 "$limit" bash -c "$script"
    rc=$?
    t1=$(date +%s.%N)
    local took
    took=$(awk "BEGIN{printf \"%.2f\", $t1 - $t0}")
    echo "=== $name: exit $rc in $took s"
    printf '%s\t%s\t%s\n' "$name" "$rc" "$took" >>"$W/steps.tsv"
    pack
}

field_list() { $PY -c "import envbuild.$1 as m; print(','.join(m.$2))"; }

{
    date -u +%FT%TZ
    uname -a
    nproc
    free -g
    cat /etc/os-release
    cat /proc/driver/nvidia/version
    $PY -c 'import sys, torch, triton; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "triton", triton.__version__); print(torch.cuda.get_device_properties(0))'
    $PY -m pip list 2>/dev/null | grep -i -E '^(nvidia-ml-py|pynvml|torch|triton|jinja2|pyyaml|requests|packaging) '
    git log -1 --format='%H %s' 2>/dev/null || true
} >"$W/machine.txt" 2>&1
cat "$W/machine.txt"
pack

# 1. what detect reads, as each tool prints it (fixtures for parse_saved and the parsers)
Q=$(field_list host.nvidia_smi QUERY_FIELDS)
D=$(field_list diagnose.gpu SMI_FIELDS)
DE=$(field_list diagnose.gpu SMI_FIELDS_EVENT)
H=$(field_list smoke.health HEALTH_FIELDS)
step smi-raw 90 "
nvidia-smi >$W/smi/table.txt 2>&1
nvidia-smi -q >$W/smi/q.txt 2>&1
nvidia-smi -q -x >$W/smi/q.xml 2>&1
nvidia-smi --query-gpu=$Q --format=csv,noheader,nounits >$W/smi/query.csv 2>&1
nvidia-smi --query-gpu=$Q --format=csv >$W/smi/query-header-units.csv 2>&1
nvidia-smi -L >$W/smi/L.txt 2>&1
nvidia-smi topo -m >$W/smi/topo.txt 2>&1
cat /proc/driver/nvidia/version >$W/smi/proc-driver-version.txt 2>&1
nvidia-smi --query-gpu=$D --format=csv,noheader,nounits >$W/smi/diagnose-fields.csv 2>&1; echo \$? >>$W/smi/diagnose-fields.csv
nvidia-smi --query-gpu=$DE --format=csv,noheader,nounits >$W/smi/diagnose-fields-event.csv 2>&1; echo \$? >>$W/smi/diagnose-fields-event.csv
nvidia-smi --query-gpu=$H --format=csv,noheader,nounits >$W/smi/health.csv 2>&1
true"

# 2. detect through NVML, through nvidia-smi (pynvml hidden), and resolve from the host
mkdir -p "$W/hide-nvml"
echo "raise ImportError('hidden by gpu-check.sh')" >"$W/hide-nvml/pynvml.py"
step detect 120 "
$PY -m envbuild detect >$W/detect/detect.txt 2>&1; echo exit \$? >>$W/detect/detect.txt
$PY -m envbuild detect --json >$W/detect/detect.json 2>$W/detect/detect.err
PYTHONPATH=$PWD:$W/hide-nvml $PY -m envbuild detect --json >$W/detect/detect-smi.json 2>$W/detect/detect-smi.err
$PY -m envbuild resolve --host --top 8 >$W/resolve/host.txt 2>&1; echo exit \$? >>$W/resolve/host.txt
$PY -m envbuild resolve --host --json >$W/resolve/host.json 2>$W/resolve/host.err
$PY -m envbuild resolve --host --torch 2.11 --cuda 13.0 --explain >$W/resolve/host-torch-2.11-cu130.txt 2>&1; echo exit \$? >>$W/resolve/host-torch-2.11-cu130.txt
true"

# 3. the smoke test at tier 4, cold (compiler caches of its own, as in a fresh image)
smoke() {  # smoke NAME TIER CACHE [ARGS...]: envbuild smoke, its report, output and exit code
    local name=$1 tier=$2 cache=$3
    shift 3
    step "smoke-$name" 200 "TRITON_CACHE_DIR=$W/cache/$cache/triton TORCHINDUCTOR_CACHE_DIR=$W/cache/$cache/inductor \
$PY -m envbuild smoke --tier $tier --timeout 150 --report $W/smoke/$name.json $* >$W/smoke/$name.out 2>$W/smoke/$name.err; \
echo \$? >$W/smoke/$name.exit"
}
smoke tier-4-cold 4 t4 --expect-gpus 1

# 4. diagnose on three real jobs, bare and diagnosed, side by side
step bench-diagnose-gpu 260 "$PY bench/bench_diagnose_gpu.py --rounds 2 --seconds 6 --device $DEVICE --out $W/diagnose"

# 5. the other tiers cold, the same warm, the images' zipapp, and a node that should have 2 GPUs
smoke tier-0-cold 0 t0
smoke tier-2-cold 2 t2
smoke tier-1-warm 1 t4
$PY -c "from envbuild.smoke.bundle import payload; open('$W/smoke/smoke.py', 'wb').write(payload())"
step smoke-zipapp-tier-4-warm 200 "TRITON_CACHE_DIR=$W/cache/t4/triton TORCHINDUCTOR_CACHE_DIR=$W/cache/t4/inductor \
$PY $W/smoke/smoke.py --tier 4 --timeout 150 --report $W/smoke/zipapp-tier-4-warm.json >$W/smoke/zipapp-tier-4-warm.out 2>&1; echo \$? >$W/smoke/zipapp-tier-4-warm.exit"
smoke expect-2-gpus 1 t4 --expect-gpus 2

# 6. nvidia-smi samples of the GPU idle, then busy with a compute job (diagnose's fixtures)
step smi-samples 60 "
timeout 4 nvidia-smi --query-gpu=$D --format=csv,noheader,nounits -lms 1000 >$W/smi/idle-stream.csv 2>&1
nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits >$W/smi/idle-apps.csv 2>&1
$PY bench/gpu_job.py compute 0 8 $W/smi/busy-job.json --device $DEVICE &
sleep 6
timeout 5 nvidia-smi --query-gpu=$D --format=csv,noheader,nounits -lms 1000 >$W/smi/busy-stream.csv 2>&1
nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits >$W/smi/busy-apps.csv 2>&1
echo \$! >$W/smi/busy-pid.txt
wait
true"

echo "=== steps"
cat "$W/steps.tsv"
pack
ls -la "$OUT"
