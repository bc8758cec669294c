#!/usr/bin/env bash
# N replicas of `metrale serve` on loopback ports behind vllm-router (tests/python/
# router-requirements.txt, installed into build/router-venv) with its cache-aware policy; prints
# the one URL to use. Ctrl-C stops everything (each replica drains first: docs/deployment.md).
#
#   bash scripts/cluster.sh [-n REPLICAS] [--port PORT] [--model DIR] [-- SERVE ARGS...]
#
# Defaults: 2 replicas of models/demo, the router on 127.0.0.1:8080, the replicas on the ports
# after it, the router's own Prometheus metrics on the next one. Logs: build/cluster/.
# METRALE_BIN=path uses that binary instead of building build/release/src/metrale.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

n=2
port=8080
model=models/demo
serve_args=()
while (($#)); do
  case "$1" in
    -n) n="$2"; shift 2 ;;
    --port) port="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --) shift; serve_args=("$@"); break ;;
    *) echo "cluster.sh: unknown argument '$1' (see the comment at the top)" >&2; exit 2 ;;
  esac
done
[[ "$n" =~ ^[1-9][0-9]?$ ]] || { echo "cluster.sh: -n expects 1..99 replicas, found '$n'" >&2; exit 2; }
[[ "$port" =~ ^[0-9]+$ ]] && ((port >= 1024 && port + n + 1 <= 65535)) ||
  { echo "cluster.sh: --port expects 1024..$((65535 - n - 1)), found '$port'" >&2; exit 2; }

bin="${METRALE_BIN:-}"
if [[ -z "$bin" ]]; then
  bash scripts/bootstrap.sh
  cmake --preset release >/dev/null
  cmake --build --preset release --target metrale
  bin=./build/release/src/metrale
fi
router_py="$(bash scripts/router-venv.sh)"
# The demo checkpoint ships no chat template: a real one from the tests (as scripts/serve.sh).
if [[ "$model" == models/demo && ! " ${serve_args[*]} " =~ " --chat-template " ]]; then
  serve_args+=(--chat-template tests/data/chat_templates/Qwen3-Coder.jinja)
fi

logs=build/cluster
mkdir -p "$logs"
pids=()
stop_all() {
  trap - INT TERM EXIT
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
stopping=""
trap 'stopping=1; stop_all' INT TERM
trap stop_all EXIT

# Waits up to 120 s for URL/health (or URL/readiness) to answer 200.
wait_ready() {
  python3 - "$1" <<'EOF'
import sys, time, urllib.request
deadline = time.time() + 120
while time.time() < deadline:
    try:
        with urllib.request.urlopen(sys.argv[1], timeout=2) as r:
            if r.status == 200:
                sys.exit(0)
    except OSError:
        time.sleep(0.1)
sys.exit(f"cluster.sh: {sys.argv[1]} never answered 200")
EOF
}

workers=()
for ((i = 1; i <= n; i++)); do
  p=$((port + i))
  "$bin" serve --model "$model" --host 127.0.0.1 --port "$p" "${serve_args[@]}" \
    >"$logs/replica-$i.log" 2>&1 &
  pids+=($!)
  workers+=("http://127.0.0.1:$p")
done
for w in "${workers[@]}"; do wait_ready "$w/health"; done

"$router_py" tests/python/router_launch.py --host 127.0.0.1 --port "$port" \
  --prometheus-port $((port + n + 1)) --worker-urls "${workers[@]}" --policy cache_aware \
  >"$logs/router.log" 2>&1 &
pids+=($!)
wait_ready "http://127.0.0.1:$port/readiness"

echo "metrale cluster: http://127.0.0.1:$port/v1 ($n replicas of $model on ports" \
  "$((port + 1))-$((port + n)) behind vllm-router, cache_aware; logs in $logs/; Ctrl-C stops all)"
# Until Ctrl-C, or until one of them exits.
wait -n "${pids[@]}" || true
if [[ -z "$stopping" ]]; then
  echo "cluster.sh: a process exited (see $logs/); stopping the others" >&2
  exit 1
fi
