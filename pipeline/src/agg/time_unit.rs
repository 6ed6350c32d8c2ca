//! Calendar units (`"year"` ... `"millisecond"`) of `$setWindowFields` range windows and
//! `$densify` steps, and adding a whole number of them to a date.
//!
//! Invariants: fixed-length units (week and smaller) add exact milliseconds; month, quarter
//! and year move the proleptic-Gregorian UTC calendar date and clamp the day to the target
//! month's last day (Jan 31 + 1 month = Feb 28/29), as MongoDB's `$dateAdd` does. Overflow is
//! `None`, never a panic.

use crate::expr::{civil_from_days, days_from_civil};
use crate::{MongoError, Result};

/// A time unit as MongoDB spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeUnit {
    Year,
    Quarter,
    Month,
    Week,
    Day,
    Hour,
    Minute,
    Second,
    Millisecond,
}

const MS_PER_DAY: i64 = 86_400_000;

impl TimeUnit {
    /// Parses a unit name (FailedToParse for anything else).
    pub fn parse(s: &str) -> Result<TimeUnit> {
        Ok(match s {
            "year" => TimeUnit::Year,
            "quarter" => TimeUnit::Quarter,
            "month" => TimeUnit::Month,
            "week" => TimeUnit::Week,
            "day" => TimeUnit::Day,
            "hour" => TimeUnit::Hour,
            "minute" => TimeUnit::Minute,
            "second" => TimeUnit::Second,
            "millisecond" => TimeUnit::Millisecond,
            other => {
                return Err(MongoError::failed_to_parse(format!(
                    "unknown time unit value: {other}"
                )));
            }
        })
    }

    /// Milliseconds in one unit, for fixed-length units (week and smaller).
    pub fn fixed_millis(self) -> Option<i64> {
        match self {
            TimeUnit::Week => Some(7 * MS_PER_DAY),
            TimeUnit::Day => Some(MS_PER_DAY),
            TimeUnit::Hour => Some(3_600_000),
            TimeUnit::Minute => Some(60_000),
            TimeUnit::Second => Some(1_000),
            TimeUnit::Millisecond => Some(1),
            TimeUnit::Year | TimeUnit::Quarter | TimeUnit::Month => None,
        }
    }

    /// `ms` (milliseconds since the epoch) plus `amount` units.
    pub fn add(self, ms: i64, amount: i64) -> Option<i64> {
        if let Some(unit) = self.fixed_millis() {
            return ms.checked_add(unit.checked_mul(amount)?);
        }
        let months = match self {
            TimeUnit::Year => amount.checked_mul(12)?,
            TimeUnit::Quarter => amount.checked_mul(3)?,
            _ => amount,
        };
        let days = ms.div_euclid(MS_PER_DAY);
        let in_day = ms.rem_euclid(MS_PER_DAY);
        let (y, m, d) = civil_from_days(days);
        let total = y.checked_mul(12)?.checked_add(m - 1)?.checked_add(months)?;
        let (ny, nm) = (total.div_euclid(12), total.rem_euclid(12) + 1);
        let nd = d.min(days_in_month(ny, nm));
        days_from_civil(ny, nm, nd)
            .checked_mul(MS_PER_DAY)?
            .checked_add(in_day)
    }
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const JAN_31_2024: i64 = 1_706_659_200_000;

    #[test]
    fn month_addition_clamps_to_the_last_day() {
        // 2024-01-31 + 1 month = 2024-02-29 (leap year), + 13 months = 2025-02-28.
        assert_eq!(TimeUnit::Month.add(JAN_31_2024, 1), Some(1_709_164_800_000));
        assert_eq!(
            TimeUnit::Month.add(JAN_31_2024, 13),
            Some(1_740_700_800_000)
        );
        assert_eq!(TimeUnit::Year.add(JAN_31_2024, -1), Some(1_675_123_200_000));
        assert_eq!(
            TimeUnit::Day.add(JAN_31_2024, 1),
            Some(JAN_31_2024 + MS_PER_DAY)
        );
        assert_eq!(TimeUnit::Hour.add(i64::MAX, 1), None);
    }

    #[test]
    fn civil_round_trip() {
        for days in [-800_000, -1, 0, 59, 60, 19_753, 2_000_000] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }
}
