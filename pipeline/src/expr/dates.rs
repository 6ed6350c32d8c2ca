//! Dates: `$year`, `$month`, `$dayOfMonth`, `$hour`, `$minute`, `$second`, `$millisecond`,
//! `$dayOfWeek`, `$dayOfYear`, `$week`, `$dateToString`, a timestamp's `$tsSecond` and
//! `$tsIncrement`, and the calendar arithmetic the
//! stages' time units share ([`civil_from_days`], [`days_from_civil`]).
//!
//! Invariants: every date is UTC: there is no timezone database, so a `timezone` other than a
//! name of UTC is 40485; the calendar is the proleptic Gregorian one; a date operand may be a
//! date, a timestamp or an ObjectId (its creation second).

use bson::Bson;

use super::parse::op_name;
use super::{Cx, Node, Op, arg, err, eval, is_nullish};
use crate::Result;
use crate::value::type_name;

/// `$tsSecond` and `$tsIncrement`: a timestamp's seconds or increment, as a long.
pub(super) fn timestamp_part(op: Op, a: &[Option<Bson>]) -> Result<Option<Bson>> {
    let v = arg(a, 0);
    Ok(Some(match v {
        None | Some(Bson::Null) | Some(Bson::Undefined) => Bson::Null,
        Some(Bson::Timestamp(t)) if op == Op::TsSecond => Bson::Int64(i64::from(t.time)),
        Some(Bson::Timestamp(t)) => Bson::Int64(i64::from(t.increment)),
        Some(other) => {
            return Err(err(
                5687301,
                format!(
                    "Argument to {} must be a timestamp, but is {}",
                    op_name(op),
                    type_name(&other)
                ),
            ));
        }
    }))
}

/// `$year` to `$week`: one field of a date, or of `{date, timezone}`.
pub(super) fn date_part(op: Op, a: &[Option<Bson>]) -> Result<Option<Bson>> {
    let name = op_name(op);
    let mut v = arg(a, 0);
    if let Some(Bson::Document(d)) = &v
        && d.contains_key("date")
    {
        check_utc(&name, &d.get("timezone").cloned())?;
        v = d.get("date").cloned();
    }
    if is_nullish(&v) {
        return Ok(Some(Bson::Null));
    }
    let ms = date_millis(&name, &v)?.unwrap_or(0);
    let p = DateParts::of(ms);
    Ok(Some(Bson::Int32(match op {
        Op::Year => i32::try_from(p.year).unwrap_or(i32::MAX),
        Op::Month => p.month,
        Op::DayOfMonth => p.day,
        Op::Hour => p.hour,
        Op::Minute => p.minute,
        Op::Second => p.second,
        Op::Millisecond => p.millis,
        Op::DayOfWeek => p.weekday + 1,
        Op::DayOfYear => p.yday + 1,
        _ => p.week(),
    })))
}

/// `$dateToString`.
pub(super) fn eval_date_to_string(
    format: Option<&Node>,
    date: &Node,
    timezone: Option<&Node>,
    on_null: Option<&Node>,
    cx: &mut Cx<'_>,
) -> Result<Option<Bson>> {
    let d = eval(date, cx)?;
    if is_nullish(&d) {
        return match on_null {
            Some(n) => eval(n, cx),
            None => Ok(Some(Bson::Null)),
        };
    }
    if let Some(tz) = timezone {
        check_utc("$dateToString", &eval(tz, cx)?)?;
    }
    let fmt = match format {
        None => ISO_DATE_FORMAT.to_string(),
        Some(f) => match eval(f, cx)? {
            None | Some(Bson::Null) => return Ok(Some(Bson::Null)),
            Some(Bson::String(s)) => s,
            Some(other) => {
                return Err(err(
                    18533,
                    format!(
                        "$dateToString requires that 'format' be a string, found: {} with value {other}",
                        type_name(&other)
                    ),
                ));
            }
        },
    };
    let ms = date_millis("$dateToString", &d)?.unwrap_or(0);
    Ok(Some(Bson::String(format_date(ms, &fmt)?)))
}

/// MongoDB's default date rendering (`$dateToString`, `$toString`): always milliseconds.
pub(super) const ISO_DATE_FORMAT: &str = "%Y-%m-%dT%H:%M:%S.%LZ";

/// The calendar fields of a UTC instant.
struct DateParts {
    year: i64,
    month: i32,
    day: i32,
    hour: i32,
    minute: i32,
    second: i32,
    millis: i32,
    /// 0 = Sunday.
    weekday: i32,
    /// 0-based day of the year.
    yday: i32,
}

impl DateParts {
    fn of(ms: i64) -> DateParts {
        let days = ms.div_euclid(86_400_000);
        let in_day = ms.rem_euclid(86_400_000);
        let (year, month, day) = civil_from_days(days);
        let small = |x: i64| i32::try_from(x).unwrap_or(0);
        DateParts {
            year,
            month: small(month),
            day: small(day),
            hour: small(in_day / 3_600_000),
            minute: small(in_day / 60_000 % 60),
            second: small(in_day / 1000 % 60),
            millis: small(in_day % 1000),
            weekday: small((days + 4).rem_euclid(7)),
            yday: small(days - days_from_civil(year, 1, 1)),
        }
    }

    /// `%U`: weeks start on Sunday; days before the year's first Sunday are week 0.
    fn week(&self) -> i32 {
        (self.yday + 7 - self.weekday) / 7
    }
}

/// Days since 1970-01-01 → (year, month 1-12, day 1-31), proleptic Gregorian.
pub(crate) fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// (year, month, day) → days since 1970-01-01.
pub(crate) fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Milliseconds since the epoch of a date-like value; `Ok(None)` for null/missing.
fn date_millis(op: &str, v: &Option<Bson>) -> Result<Option<i64>> {
    Ok(match v {
        None | Some(Bson::Null) | Some(Bson::Undefined) => None,
        Some(Bson::DateTime(d)) => Some(d.timestamp_millis()),
        Some(Bson::Timestamp(t)) => Some(i64::from(t.time) * 1000),
        Some(Bson::ObjectId(o)) => Some(o.timestamp().timestamp_millis()),
        Some(other) => {
            return Err(err(
                16006,
                format!(
                    "{op}: can't convert from BSON type {} to Date",
                    type_name(other)
                ),
            ));
        }
    })
}

/// Only UTC is supported as a timezone (there is no timezone database here).
fn check_utc(op: &str, tz: &Option<Bson>) -> Result<()> {
    match tz {
        None | Some(Bson::Null) => Ok(()),
        Some(Bson::String(s))
            if matches!(
                s.as_str(),
                "UTC" | "GMT" | "Z" | "+00:00" | "+0000" | "Etc/UTC"
            ) =>
        {
            Ok(())
        }
        Some(other) => Err(err(
            40485,
            format!("{op}: unrecognized time zone identifier: {other} (only UTC is supported)"),
        )),
    }
}

pub(super) fn format_date(ms: i64, fmt: &str) -> Result<String> {
    let p = DateParts::of(ms);
    let mut out = String::with_capacity(fmt.len() + 8);
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&format!("{:04}", p.year)),
            Some('m') => out.push_str(&format!("{:02}", p.month)),
            Some('d') => out.push_str(&format!("{:02}", p.day)),
            Some('H') => out.push_str(&format!("{:02}", p.hour)),
            Some('M') => out.push_str(&format!("{:02}", p.minute)),
            Some('S') => out.push_str(&format!("{:02}", p.second)),
            Some('L') => out.push_str(&format!("{:03}", p.millis)),
            Some('j') => out.push_str(&format!("{:03}", p.yday + 1)),
            Some('w') => out.push_str(&(p.weekday + 1).to_string()),
            Some('u') => out.push_str(&(if p.weekday == 0 { 7 } else { p.weekday }).to_string()),
            Some('U') => out.push_str(&format!("{:02}", p.week())),
            Some('z') => out.push_str("+0000"),
            Some('Z') => out.push('0'),
            Some('%') => out.push('%'),
            Some(other) => {
                return Err(err(
                    18536,
                    format!("Invalid format character '%{other}' in format string"),
                ));
            }
            None => {
                return Err(err(18535, "Unmatched '%' at end of format string"));
            }
        }
    }
    Ok(out)
}
