//! The check script's reply (`tollgate_check_v3.lua`: one integer array) read as a
//! [`Verdict`]; a reply of another shape is the store failing.

use super::buckets::leaves_at_ms;
use super::{Check, LimiterError, Verdict, WindowState};

/// Turn the script's integer reply into a verdict.
pub(super) fn verdict(c: &Check, r: &[i64]) -> Result<Verdict, LimiterError> {
    let at = |i: usize| r.get(i).copied().ok_or_else(|| malformed(r));
    let index = |i: usize, len: usize| usize::try_from(at(i)?).ok().filter(|&x| x < len).ok_or_else(|| malformed(r));
    let unsigned = |i: usize| at(i).map(|v| u64::try_from(v).unwrap_or(0));
    match at(0)? {
        0 => {
            let mut windows = Vec::with_capacity(c.windows.len());
            for (i, w) in c.windows.iter().enumerate() {
                let counted = unsigned(1 + 2 * i)?;
                let oldest = at(2 + 2 * i)?;
                let remaining = w.limit.saturating_sub(counted + 1);
                windows.push(WindowState { limit: w.limit, remaining, reset_at_ms: leaves_at_ms(oldest) });
            }
            let base = 1 + 2 * c.windows.len();
            let gates_in_use = (0..c.gates.len()).map(|j| unsigned(base + j)).collect::<Result<Vec<_>, _>>()?;
            Ok(Verdict::Admitted { windows, gates_in_use, lease: c.lease() })
        }
        1 => {
            let index = index(1, c.windows.len())?;
            let retry_after_ms = unsigned(3)?;
            let limit = c.windows[index].limit;
            let state = WindowState { limit, remaining: 0, reset_at_ms: c.now_ms.saturating_add(at(3)?) };
            Ok(Verdict::WindowRefused { index, state, retry_after_ms })
        }
        2 => Ok(Verdict::GateRefused {
            index: index(1, c.gates.len())?,
            in_use: unsigned(2)?,
            retry_after_ms: unsigned(3)?,
        }),
        3 => {
            let limit = c.tpm.as_ref().map(|t| t.limit).ok_or_else(|| malformed(r))?;
            Ok(Verdict::TokensRefused { used: unsigned(1)?, limit, retry_after_ms: unsigned(2)?, never: at(3)? == 1 })
        }
        4 => Err(LimiterError::Recovering { retry_after_ms: unsigned(1)? }),
        _ => Err(malformed(r)),
    }
}

fn malformed(reply: &[i64]) -> LimiterError {
    LimiterError::Unavailable(format!("the limiter's check script returned a malformed reply {reply:?}"))
}
