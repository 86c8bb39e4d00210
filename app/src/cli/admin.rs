//! `tollgate admin ...`: operator commands over the admin API. Readable output by
//! default, the API's JSON with `--json`. The token comes from `--token`,
//! `TOLLGATE_ADMIN_TOKEN`, or the token file named in the config.

use std::process::ExitCode;

use serde_json::{Value, json};

use super::{config_path, take_flag};

const HELP: &str = "tollgate admin [--config F] [--url http://127.0.0.1:8081] [--token T] [--json] <command>
  workspace create --name NAME [--tier free|core|enterprise]
  workspace show WORKSPACE_ID
  workspace ledger WORKSPACE_ID
  workspace freeze WORKSPACE_ID [--reason unpaid|dispute]
  workspace unfreeze WORKSPACE_ID
  credits add WORKSPACE_ID --cents N [--source purchase|promo|grant]   (default purchase)
  key create WORKSPACE_ID [--name N] [--scope workspace|deployment|terminal] [--expires-in-days 30|60|90|365]
                          [--credits-only] [--monthly-limit-cents N] [--rpm N] [--created-by WHO]
  key show KEY_ID
  key update KEY_ID [--monthly-limit-cents N|none] [--rpm N|none] [--credits-only true|false]
                    [--expires-at ISO8601|none]
  key rotate KEY_ID [--revoke-previous] [--grace-seconds N]
  key revoke KEY_ID
  key delete KEY_ID
  key copy KEY_ID --actor WHO --role owner|creator|member|viewer
  model pause MODEL --until ISO8601
  model resume MODEL
  plan set WORKSPACE_ID --tier starter|pro|team [--status active|past_due|unpaid|disputed|canceled]
           [--credits-after-limits] [--cap-cents N] [--grace-until ISO8601] [--cancel-at ISO8601]
  plan show WORKSPACE_ID
  plan clear WORKSPACE_ID
  health
  reload                 (re-read models.yaml and upstreams.yaml; a bad file changes nothing)";

struct Client {
    url: String,
    token: String,
    agent: ureq::Agent,
}

impl Client {
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<(u16, Value), String> {
        let url = format!("{}{path}", self.url);
        let auth = format!("Bearer {}", self.token);
        let result = match (method, body) {
            ("GET", _) => self.agent.get(&url).header("authorization", &auth).call(),
            ("DELETE", _) => self.agent.delete(&url).header("authorization", &auth).call(),
            ("PATCH", b) => self.agent.patch(&url).header("authorization", &auth).send_json(b.unwrap_or(json!({}))),
            ("PUT", b) => self.agent.put(&url).header("authorization", &auth).send_json(b.unwrap_or(json!({}))),
            (_, b) => self.agent.post(&url).header("authorization", &auth).send_json(b.unwrap_or(json!({}))),
        };
        let mut resp = result.map_err(|e| format!("admin API at {} not reachable: {e}", self.url))?;
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        let value =
            if text.is_empty() { Value::Null } else { serde_json::from_str(&text).unwrap_or(Value::String(text)) };
        Ok((status, value))
    }
}

fn flag(args: &mut Vec<String>, name: &str) -> Result<Option<String>, String> {
    let (v, rest) = take_flag(args, &[name])?;
    *args = rest;
    Ok(v)
}

fn switch(args: &mut Vec<String>, name: &str) -> bool {
    let before = args.len();
    args.retain(|a| a != name);
    args.len() != before
}

fn int(v: Option<String>, name: &str) -> Result<Option<i64>, String> {
    v.map(|s| s.parse::<i64>().map_err(|_| format!("{name} must be a whole number"))).transpose()
}

fn print_readable(v: &Value, indent: usize) {
    match v {
        Value::Object(map) => {
            for (k, val) in map {
                if val.is_object() {
                    println!("{:indent$}{k}:", "");
                    print_readable(val, indent + 2);
                } else {
                    let shown = match val {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    println!("{:indent$}{k}: {shown}", "");
                }
            }
        }
        other => println!("{other}"),
    }
}

pub fn main(args: &[String]) -> Result<ExitCode, String> {
    let (config, mut args) = config_path(args)?;
    let as_json = switch(&mut args, "--json");
    let url = flag(&mut args, "--url")?;
    let token = flag(&mut args, "--token")?;
    let loaded = tollgate::config::load_settings(&config).ok();
    let url = match (url, loaded.as_ref().map(|c| c.admin_listen)) {
        (Some(url), _) => url,
        // The port `serve` picked is on its first line of output, not in the file.
        (None, Some(listen)) if listen.port() == 0 => {
            return Err(format!("admin_listen: {listen} has port 0: pass --url with the port `serve` printed"));
        }
        (None, Some(listen)) => format!("http://{listen}"),
        (None, None) => "http://127.0.0.1:8081".into(),
    };
    let token = token
        .or_else(|| std::env::var("TOLLGATE_ADMIN_TOKEN").ok())
        .or_else(|| loaded.as_ref().and_then(|c| c.admin_token.as_ref().map(|t| t.expose().to_string())))
        .ok_or("no admin token: pass --token, set TOLLGATE_ADMIN_TOKEN, or name admin.token_file in the config")?;
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let client = Client { url: url.trim_end_matches('/').to_string(), token, agent };

    let words: Vec<String> = args.clone();
    let word = |i: usize| words.get(i).cloned();
    let (method, path, body): (&str, String, Option<Value>) = match (word(0).as_deref(), word(1).as_deref()) {
        (Some("workspace"), Some("create")) => {
            let name = flag(&mut args, "--name")?.ok_or("--name is required")?;
            let tier = flag(&mut args, "--tier")?;
            let mut b = json!({ "name": name });
            if let Some(t) = tier {
                b["rate_tier"] = json!(t);
            }
            ("POST", "/admin/v1/workspaces".into(), Some(b))
        }
        (Some("workspace"), Some("show")) => {
            ("GET", format!("/admin/v1/workspaces/{}", word(2).ok_or("WORKSPACE_ID?")?), None)
        }
        (Some("workspace"), Some("ledger")) => {
            ("GET", format!("/admin/v1/workspaces/{}/ledger", word(2).ok_or("WORKSPACE_ID?")?), None)
        }
        (Some("workspace"), Some(action @ ("freeze" | "unfreeze"))) => {
            let ws = word(2).ok_or("WORKSPACE_ID?")?;
            let mut b = json!({});
            if let Some(r) = flag(&mut args, "--reason")? {
                b["reason"] = json!(r);
            }
            ("POST", format!("/admin/v1/workspaces/{ws}/{action}"), Some(b))
        }
        (Some("credits"), Some("add")) => {
            let ws = word(2).ok_or("WORKSPACE_ID?")?;
            let cents = int(flag(&mut args, "--cents")?, "--cents")?.ok_or("--cents is required")?;
            let source = flag(&mut args, "--source")?.unwrap_or_else(|| "purchase".into());
            (
                "POST",
                format!("/admin/v1/workspaces/{ws}/credits"),
                Some(json!({"amount_cents": cents, "source": source})),
            )
        }
        (Some("key"), Some("update")) => {
            let id = word(2).ok_or("KEY_ID?")?;
            let mut b = json!({});
            // `none` clears a limit or the expiry (null in the API).
            for (name, field) in [("--monthly-limit-cents", "monthly_spend_limit_cents"), ("--rpm", "rate_limit_rpm")] {
                match flag(&mut args, name)?.as_deref() {
                    Some("none") => b[field] = Value::Null,
                    Some(v) => b[field] = json!(int(Some(v.to_string()), name)?),
                    None => {}
                }
            }
            match flag(&mut args, "--credits-only")?.as_deref() {
                Some("true") => b["credits_only"] = json!(true),
                Some("false") => b["credits_only"] = json!(false),
                Some(_) => return Err("--credits-only takes true or false".into()),
                None => {}
            }
            match flag(&mut args, "--expires-at")?.as_deref() {
                Some("none") => b["expires_at"] = Value::Null,
                Some(v) => b["expires_at"] = json!(v),
                None => {}
            }
            if b.as_object().is_some_and(|o| o.is_empty()) {
                return Err(
                    "key update: give at least one of --monthly-limit-cents, --rpm, --credits-only, --expires-at"
                        .into(),
                );
            }
            ("PATCH", format!("/admin/v1/keys/{id}"), Some(b))
        }
        (Some("key"), Some("create")) => {
            let ws = word(2).ok_or("WORKSPACE_ID?")?;
            let mut b = json!({});
            if let Some(v) = flag(&mut args, "--name")? {
                b["name"] = json!(v);
            }
            if let Some(v) = flag(&mut args, "--scope")? {
                b["scope"] = json!(v);
            }
            if let Some(v) = int(flag(&mut args, "--expires-in-days")?, "--expires-in-days")? {
                b["expires_in_days"] = json!(v);
            }
            if let Some(v) = int(flag(&mut args, "--monthly-limit-cents")?, "--monthly-limit-cents")? {
                b["monthly_spend_limit_cents"] = json!(v);
            }
            if let Some(v) = int(flag(&mut args, "--rpm")?, "--rpm")? {
                b["rate_limit_rpm"] = json!(v);
            }
            if let Some(v) = flag(&mut args, "--created-by")? {
                b["created_by"] = json!(v);
            }
            if switch(&mut args, "--credits-only") {
                b["credits_only"] = json!(true);
            }
            ("POST", format!("/admin/v1/workspaces/{ws}/keys"), Some(b))
        }
        (Some("key"), Some("show")) => ("GET", format!("/admin/v1/keys/{}", word(2).ok_or("KEY_ID?")?), None),
        (Some("key"), Some("revoke")) => ("POST", format!("/admin/v1/keys/{}/revoke", word(2).ok_or("KEY_ID?")?), None),
        (Some("key"), Some("delete")) => ("DELETE", format!("/admin/v1/keys/{}", word(2).ok_or("KEY_ID?")?), None),
        (Some("key"), Some("rotate")) => {
            let id = word(2).ok_or("KEY_ID?")?;
            let mut b = json!({});
            if switch(&mut args, "--revoke-previous") {
                b["revoke_previous_immediately"] = json!(true);
            }
            if let Some(v) = int(flag(&mut args, "--grace-seconds")?, "--grace-seconds")? {
                b["grace_seconds"] = json!(v);
            }
            ("POST", format!("/admin/v1/keys/{id}/rotate"), Some(b))
        }
        (Some("key"), Some("copy")) => {
            let id = word(2).ok_or("KEY_ID?")?;
            let actor = flag(&mut args, "--actor")?.ok_or("--actor is required")?;
            let role = flag(&mut args, "--role")?.ok_or("--role is required")?;
            ("POST", format!("/admin/v1/keys/{id}/copy"), Some(json!({"actor": actor, "role": role})))
        }
        (Some("model"), Some("pause")) => {
            let model = word(2).ok_or("MODEL?")?;
            let until = flag(&mut args, "--until")?.ok_or("--until is required")?;
            ("POST", format!("/admin/v1/models/{model}/pause"), Some(json!({ "until": until })))
        }
        (Some("model"), Some("resume")) => {
            ("POST", format!("/admin/v1/models/{}/resume", word(2).ok_or("MODEL?")?), None)
        }
        (Some("plan"), Some("set")) => {
            let ws = word(2).ok_or("WORKSPACE_ID?")?;
            let tier = flag(&mut args, "--tier")?.ok_or("--tier is required (starter, pro or team)")?;
            let status = flag(&mut args, "--status")?.unwrap_or_else(|| "active".into());
            let mut b = json!({ "tier": tier, "status": status });
            let cap = int(flag(&mut args, "--cap-cents")?, "--cap-cents")?;
            if switch(&mut args, "--credits-after-limits") || cap.is_some() {
                b["credits_after_limits"] = json!({ "enabled": true, "cap_cents": cap });
            }
            for (name, field) in
                [("--grace-until", "grace_until"), ("--cancel-at", "cancel_at"), ("--started-at", "started_at")]
            {
                if let Some(v) = flag(&mut args, name)? {
                    b[field] = json!(v);
                }
            }
            ("PUT", format!("/admin/v1/workspaces/{ws}/plan"), Some(b))
        }
        (Some("plan"), Some("show")) => {
            ("GET", format!("/admin/v1/workspaces/{}/plan", word(2).ok_or("WORKSPACE_ID?")?), None)
        }
        (Some("plan"), Some("clear")) => {
            ("DELETE", format!("/admin/v1/workspaces/{}/plan", word(2).ok_or("WORKSPACE_ID?")?), None)
        }
        (Some("health"), _) => ("GET", "/admin/v1/health".into(), None),
        (Some("reload"), _) => ("POST", "/admin/v1/reload".into(), None),
        _ => {
            println!("{HELP}");
            return Ok(ExitCode::from(2));
        }
    };
    let (status, value) = client.call(method, &path, body)?;
    if as_json {
        println!("{}", serde_json::to_string_pretty(&value).unwrap_or_default());
    } else if status == 204 {
        println!("done");
    } else {
        print_readable(&value, 0);
    }
    Ok(if (200..300).contains(&status) { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
