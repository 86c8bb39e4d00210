//! Time as the stores and the money paths keep it: integer milliseconds since the Unix
//! epoch, ISO 8601 for the wire, and UTC calendar months (key spending limits, billing
//! periods). Shared by identity, the stores and the plugins, so none of them imports another
//! for a clock.

/// Milliseconds since the Unix epoch (the stores keep every instant in this unit).
pub type Millis = i64;

pub fn now_ms() -> Millis {
    jiff::Timestamp::now().as_millisecond()
}

/// ISO 8601 of a stored instant.
pub fn iso(ms: Millis) -> String {
    jiff::Timestamp::from_millisecond(ms).map(|t| t.to_string()).unwrap_or_default()
}

/// Start of the UTC month containing `ms`, start of the next one, and its `YYYY-MM` name.
pub fn utc_month_bounds(ms: Millis) -> (Millis, Millis, String) {
    // Every billed request asks; the month changes twelve times a year.
    thread_local! {
        static LAST: std::cell::RefCell<Option<(Millis, Millis, String)>> = const { std::cell::RefCell::new(None) };
    }
    let hit = LAST.with_borrow(|last| last.as_ref().filter(|(start, next, _)| (*start..*next).contains(&ms)).cloned());
    if let Some(bounds) = hit {
        return bounds;
    }
    let bounds = month_bounds(ms);
    LAST.set(Some(bounds.clone()));
    bounds
}

fn month_bounds(ms: Millis) -> (Millis, Millis, String) {
    let ts = jiff::Timestamp::from_millisecond(ms).unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    let date = ts.to_zoned(jiff::tz::TimeZone::UTC).date();
    let first = date.first_of_month();
    let next = first.checked_add(jiff::Span::new().months(1)).unwrap_or(first);
    let at =
        |d: jiff::civil::Date| d.to_zoned(jiff::tz::TimeZone::UTC).map(|z| z.timestamp().as_millisecond()).unwrap_or(0);
    (at(first), at(next), format!("{:04}-{:02}", first.year(), first.month()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn month_bounds_are_utc_calendar_months() {
        let ms = "2026-11-22T07:00:00Z".parse::<jiff::Timestamp>().map(|t| t.as_millisecond()).unwrap_or(0);
        let (start, next, month) = utc_month_bounds(ms);
        assert_eq!(iso(start), "2026-11-01T00:00:00Z");
        assert_eq!(iso(next), "2026-12-01T00:00:00Z");
        assert_eq!(month, "2026-11");
        let dec = "2026-12-31T23:59:59Z".parse::<jiff::Timestamp>().map(|t| t.as_millisecond()).unwrap_or(0);
        assert_eq!(iso(utc_month_bounds(dec).1), "2027-01-01T00:00:00Z");
    }

    /// The per-thread cache answers as the computation does, at the edges of months too.
    #[test]
    fn cached_month_bounds_match_the_computation() {
        let at = |t: &str| t.parse::<jiff::Timestamp>().map(|t| t.as_millisecond()).unwrap_or(0);
        for t in [
            "2026-11-22T07:00:00Z",
            "2026-11-30T23:59:59.999Z",
            "2026-12-01T00:00:00Z",
            "2026-11-01T00:00:00Z",
            "2026-10-31T23:59:59.999Z",
            "2028-02-29T12:00:00Z",
            "2026-11-22T07:00:00Z",
        ] {
            assert_eq!(utc_month_bounds(at(t)), month_bounds(at(t)), "{t}");
        }
    }
}
