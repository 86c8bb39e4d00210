# Sourced by scripts/profile.sh and ledger_load.sh, and run by scripts/bench.py (stack.py): the
# config sections their gateways share.

# identity_yaml STORE_YAML SECRETS_DIR: the `identity` and `admin` sections of a gateway
# config on STORE_YAML (a flow mapping, e.g. "{ backend: sqlite, path: /x/tollgate.db }"),
# with the secrets `tollgate init-secrets --dir SECRETS_DIR` wrote.
identity_yaml() {
    cat <<EOY
identity:
  store: $1
  migrate_on_start: true
  key_pepper: { file: $2/key_pepper }
  key_encryption_key: { file: $2/key_encryption_key }
admin:
  token_file: $2/admin_token
EOY
}

# open_limits_yaml STORE_YAML: a `limits` section on STORE_YAML with every limit so high that
# no request of a bench is refused (what is measured is the checks, not refusals).
open_limits_yaml() {
    cat <<EOY
limits:
  store: $1
  connection_gate: { per_address_per_minute: 100000000, service_per_minute: 100000000 }
  requests_per_minute: { free: 100000000, core: 100000000, enterprise: 100000000 }
  workspace_concurrency: { free: 100000, core: 100000, enterprise: 100000 }
EOY
}

# full_chain_plugins_yaml: conf/tollgate.yaml's plugin chain (requests carry no
# Idempotency-Key, so the idempotency plugin only looks).
full_chain_plugins_yaml() {
    cat <<'EOY'
plugins:
  - name: connection_gate
  - name: auth
  - name: dialects
  - name: idempotency
  - name: chat_completions
  - name: limits
  - name: billing
EOY
}

# bench_models_yaml [ENDPOINTS]: the one priced model every bench serves (ENDPOINTS defaults
# to "chat_completions").
bench_models_yaml() {
    cat <<EOY
models:
  - id: llama-3.1-8b-instruct
    display_name: Llama 3.1 8B Instruct
    created: 1721692800
    supported_endpoints: [${1:-chat_completions}]
    max_output_tokens: 8192
    context_window: 131072
    pricing: { input: 0.10, output: 0.30 }
EOY
}

# bench_upstreams_yaml PORT MAX_CONCURRENCY: that model's pool, one mock replica on PORT.
bench_upstreams_yaml() {
    cat <<EOY
pools:
  llama-3.1-8b-instruct:
    upstream_model: meta-llama/Llama-3.1-8B-Instruct
    replicas:
      - { address: "127.0.0.1:$1", max_concurrency: $2 }
EOY
}
