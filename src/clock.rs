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
}
