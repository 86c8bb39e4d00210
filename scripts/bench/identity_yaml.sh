# Sourced by scripts/profile.sh, ledger_load.sh and bench.sh.
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
