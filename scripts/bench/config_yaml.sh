# Sourced by scripts/bench.sh, profile.sh and ledger_load.sh: the config sections their
# gateways share.

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
