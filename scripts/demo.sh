#!/usr/bin/env bash
# One command for a newcomer: build tollgate, start the bundled mock replica and the
# gateway on the embedded default (no Redis or PostgreSQL), send one request, and print how
# to call it. Ctrl-C stops both.
#   PORT=8080 scripts/demo.sh      (the mock replica listens on a port it picks)
set -euo pipefail
cd "$(dirname "$0")/.."
PORT="${PORT:-8080}"
# shellcheck source=lib/stack.sh
source scripts/lib/stack.sh

scripts/setup.sh
echo "demo: building (release; the first build takes a few minutes)"
cargo build --release --bins -q

./target/release/tollgate init-secrets --dir data/secrets
data_dir="$(pwd)/data"
run_dir="$(mktemp -d /tmp/tollgate-demo.XXXXXX)"
stack_init "$run_dir"
trap 'exit 130' INT TERM
stack_mock mock ./target/release/tollgate-mock-replica --listen 127.0.0.1:0
cp conf/models.yaml "$run_dir/"
sed "s/127.0.0.1:18000/127.0.0.1:${MOCK_PORT}/" conf/upstreams.yaml > "$run_dir/upstreams.yaml"
sed "s/^listen: .*/listen: 127.0.0.1:${PORT}/; s/grace_period_seconds: .*/grace_period_seconds: 2/; s#\.\./data#${data_dir}#g" \
  conf/tollgate.yaml > "$run_dir/tollgate.yaml"

stack_gateway gateway ./target/release/tollgate serve --config "$run_dir/tollgate.yaml"

admin() { ./target/release/tollgate admin --config "$run_dir/tollgate.yaml" --json "$@"; }
json_field() { python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }
admin health >/dev/null || { echo "demo: the admin API does not answer; see $run_dir/gateway.log"; exit 1; }

# A demo workspace and key. Only the key's id is kept on disk (data/demo-key-id), never the
# key: later runs rotate it, revoking the previous one, to show a fresh key.
if [ -s data/demo-key-id ] && answer="$(admin key rotate "$(cat data/demo-key-id)" --revoke-previous)"; then
  :
else
  ws="$(admin workspace create --name demo | json_field "['id']")"
  answer="$(admin key create "$ws" --name demo --created-by demo)"
fi
KEY="$(printf '%s' "$answer" | json_field "['key']")"
printf '%s' "$answer" | json_field "['id']" > data/demo-key-id

base="http://127.0.0.1:${PORT}"
echo
echo "tollgate is running at ${base} in front of a mock replica (logs in ${run_dir})."
echo "Your demo API key (shown once): ${KEY}"
echo "A chat completion through it:"
curl -s "${base}/v1/chat/completions" -H "authorization: Bearer ${KEY}" -H 'content-type: application/json' \
  -d '{"model":"llama-3.1-8b-instruct","messages":[{"role":"user","content":"Hello!"}],"max_tokens":8}'
echo
cat <<EOT

Try it yourself:
  export TOLLGATE_KEY=${KEY}
  curl ${base}/v1/models -H "authorization: Bearer \$TOLLGATE_KEY"
  curl -N ${base}/v1/chat/completions -H "authorization: Bearer \$TOLLGATE_KEY" -H 'content-type: application/json' \\
    -d '{"model":"llama-3.1-8b-instruct","messages":[{"role":"user","content":"Hi"}],"stream":true,"stream_options":{"include_usage":true}}'

With the official openai client (pip install openai):
  from openai import OpenAI
  client = OpenAI(base_url="${base}/v1", api_key="${KEY}")
  print(client.chat.completions.create(model="llama-3.1-8b-instruct",
        messages=[{"role": "user", "content": "Hi"}]).choices[0].message.content)

Operators: ./target/release/tollgate admin --config ${run_dir}/tollgate.yaml help
Ctrl-C stops the gateway and the mock.
EOT
wait
