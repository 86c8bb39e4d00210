//! The ledger store suite on both backends, each with group commit (what `serve` runs) and
//! without (each write its own transaction): top-ups, atomic holds, exactly-once settlement
//! with the cent carry, releases, the expiry sweep, and balance == sum of entries; and what
//! batching must keep exact under concurrency (refusals, settlement once, the audit).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::pg;
use tollgate::identity::{RateTier, Workspace};
use tollgate::money::plans::decide::{FundAsk, Funding, Refusal};
use tollgate::money::plans::{PlanSettings, PlanTerms, Status, Tier};
use tollgate::runtime::clock::now_ms;
use tollgate::store::ledger::ops::{FundOp, FundRefusal};
use tollgate::store::ledger::{HoldOutcome, LedgerStore, SettleOutcome, Settlement};
use tollgate::store::{StoreConfig, Stores};

async fn sqlite() -> Stores {
    let dir = std::env::temp_dir().join(format!("tollgate-ledger-{}", uuid::Uuid::new_v4().simple()));
    let s = tollgate::store::open_stores(&StoreConfig::Sqlite { path: dir.join("l.db") }).await.unwrap();
    s.identity.migrate().await.unwrap();
    s
}

/// PostgreSQL with a generous call bound: these tests run hundreds of calls at once on one
/// workspace row, on a machine that may be running a build beside them, and are about
/// exactness, not outages (a timed-out call there is a store outage, tested elsewhere).
fn pg_config(url: String) -> StoreConfig {
    StoreConfig::Postgres { url, call_timeout: Duration::from_secs(120), tls: None }
}

async fn postgres() -> Stores {
    let s = tollgate::store::open_stores(&pg_config(pg::fresh_database().await)).await.unwrap();
    s.identity.migrate().await.unwrap();
    s
}

async fn sqlite_unbatched() -> Stores {
    let dir = std::env::temp_dir().join(format!("tollgate-ledger-{}", uuid::Uuid::new_v4().simple()));
    let s = tollgate::store::open_stores_unbatched(&StoreConfig::Sqlite { path: dir.join("l.db") }).await.unwrap();
    s.identity.migrate().await.unwrap();
    s
}

async fn postgres_unbatched() -> Stores {
    let url = pg::fresh_database().await;
    let s = tollgate::store::open_stores_unbatched(&pg_config(url)).await.unwrap();
    s.identity.migrate().await.unwrap();
    s
}

async fn workspace(s: &Stores) -> String {
    let ws = Workspace {
        id: uuid::Uuid::new_v4().to_string(),
        name: "w".into(),
        rate_tier: RateTier::Free,
        created_at: now_ms(),
        frozen: None,
        lifetime_purchases_cents: 0,
        plan: None,
    };
    s.identity.create_workspace(&ws).await.unwrap();
    ws.id
}

fn settlement(ws: &str, rid: &str, cost: u64) -> Settlement {
    Settlement {
        request_id: rid.into(),
        workspace_id: ws.into(),
        key_id: Some("key_a".into()),
        cost: tollgate::money::Microcents(cost),
        value: tollgate::money::Microcents(cost),
        now: now_ms(),
        month: "2026-11".into(),
    }
}

macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() { super::$name(super::sqlite().await).await }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() { super::$name(super::postgres().await).await }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite_unbatched() { super::$name(super::sqlite_unbatched().await).await }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres_unbatched() { super::$name(super::postgres_unbatched().await).await }
        }
    )*};
}

/// Two instances (two sets of stores, as two gateways open them) on one store, for each backend.
macro_rules! two_instances {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use tollgate::store::{StoreConfig, open_stores};

            async fn run(cfg: StoreConfig) {
                let a = open_stores(&cfg).await.unwrap();
                a.identity.migrate().await.unwrap();
                let b = open_stores(&cfg).await.unwrap();
                super::$name(a, b).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                let dir = std::env::temp_dir().join(format!("tollgate-ledger-{}", uuid::Uuid::new_v4().simple()));
                run(StoreConfig::Sqlite { path: dir.join("l.db") }).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                run(super::pg_config(super::pg::fresh_database().await)).await
            }
        }
    )*};
}

fn fund_op(ws: &str, rid: &str, value_cents: i64, expires_at: i64) -> FundOp {
    let mut settings = PlanSettings::default();
    settings.starter.five_hour_microcents = 40 * 1_000_000;
    settings.starter.plan_concurrency = 4;
    FundOp {
        request_id: rid.into(),
        workspace_id: ws.into(),
        key_id: Some("key_a".into()),
        ask: FundAsk {
            value_microcents: value_cents * 1_000_000,
            hold_cents: value_cents,
            covered: true,
            ..FundAsk::default()
        },
        settings: Arc::new(settings),
        expires_at,
        now: now_ms(),
    }
}

#[path = "ledger_store/basics.rs"]
mod basics;
#[path = "ledger_store/concurrency.rs"]
mod concurrency;
#[path = "ledger_store/leases.rs"]
mod leases;
#[path = "ledger_store/plan_holds.rs"]
mod plan_holds;
#[path = "ledger_store/schema.rs"]
mod schema;
