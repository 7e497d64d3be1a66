//! Flink scalar functions that DataFusion lacks: `DATE_FORMAT` (with Java's pattern letters)
//! and `MOD`.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, StringArray, StringBuilder};
use arrow::datatypes::{DataType, TimeUnit, TimestampMillisecondType};
use datafusion_common::{DataFusionError, Result as DFResult, ScalarValue, exec_err, plan_err};
use datafusion_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

/// Converts a Java `SimpleDateFormat` pattern (`yyyy-MM-dd HH:mm:ss.SSS`) into a chrono format
/// string.
pub fn java_to_chrono(pattern: &str) -> Result<String, String> {
    translate(pattern).map(|(format, _)| format)
}

const SECOND_MS: i64 = 1_000;
const MINUTE_MS: i64 = 60 * SECOND_MS;
const HOUR_MS: i64 = 60 * MINUTE_MS;
const DAY_MS: i64 = 24 * HOUR_MS;

/// The chrono format string of a Java pattern, and the length in milliseconds of its finest
/// unit (a day for `yyyy-MM-dd`, a minute for `HH:mm`, 1 with `S`): timestamps in the same
/// such unit (UTC) format alike.
fn translate(pattern: &str) -> Result<(String, i64), String> {
    let chars: Vec<char> = pattern.chars().collect();
    let mut out = String::new();
    let mut unit = DAY_MS;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '\'' {
            // Quoted literal; '' is a quote.
            i += 1;
            if i < chars.len() && chars[i] == '\'' {
                out.push('\'');
                i += 1;
                continue;
            }
            while i < chars.len() && chars[i] != '\'' {
                if chars[i] == '%' {
                    out.push_str("%%");
                } else {
                    out.push(chars[i]);
                }
                i += 1;
            }
            i += 1;
            continue;
        }
        if !c.is_ascii_alphabetic() {
            if c == '%' {
                out.push_str("%%");
            } else {
                out.push(c);
            }
            i += 1;
            continue;
        }
        let mut n = 1;
        while i + n < chars.len() && chars[i + n] == c {
            n += 1;
        }
        let spec = match (c, n) {
            ('y', 2) => "%y".to_string(),
            ('y', _) => "%Y".to_string(),
            ('M', 1) => "%-m".to_string(),
            ('M', 2) => "%m".to_string(),
            ('M', 3) => "%b".to_string(),
            ('M', _) => "%B".to_string(),
            ('d', 1) => "%-d".to_string(),
            ('d', _) => "%d".to_string(),
            ('H', 1) => "%-H".to_string(),
            ('H', _) => "%H".to_string(),
            ('h', 1) => "%-I".to_string(),
            ('h', _) => "%I".to_string(),
            ('m', 1) => "%-M".to_string(),
            ('m', _) => "%M".to_string(),
            ('s', 1) => "%-S".to_string(),
            ('s', _) => "%S".to_string(),
            ('S', n) => format!("%{}f", n.min(9)),
            ('a', _) => "%p".to_string(),
            ('E', 1..=3) => "%a".to_string(),
            ('E', _) => "%A".to_string(),
            ('D', _) => "%j".to_string(),
            other => return Err(format!("pattern letter '{}' is not supported", other.0)),
        };
        unit = unit.min(match c {
            'H' | 'h' | 'a' => HOUR_MS,
            'm' => MINUTE_MS,
            's' => SECOND_MS,
            'S' => 1,
            _ => DAY_MS,
        });
        out.push_str(&spec);
        i += n;
    }
    Ok((out, unit))
}

/// Formats millisecond timestamps (UTC) with chrono `items`, once per run of timestamps in the
/// same `unit` (see [`translate`]): a stream in time order formats each day (or minute) once
/// and copies the bytes for the rows after it, a run at a time (a run's rows are told by two
/// comparisons with its unit's bounds, not a division per row), into a builder of text, whose
/// bytes need no check. A batch within one unit is one text repeated ([`one_unit_text`]).
///
/// # Errors
/// When the text outgrows a string array's 32-bit offsets.
fn format_millis(
    ts: &arrow::array::TimestampMillisecondArray,
    items: &[chrono::format::Item],
    unit: i64,
) -> DFResult<StringArray> {
    use std::fmt::Write;
    let n = ts.len();
    if let Some(text) = one_unit_text(ts, items, unit) {
        offset(text.len() * n)?;
        return Ok(StringArray::new_repeated(text, n));
    }
    let values = ts.values();
    let nulls = ts.nulls().filter(|nb| nb.null_count() > 0);
    let is_null = |i: usize| nulls.is_some_and(|nb| nb.is_null(i));
    // The builder takes `&str`, so its bytes need no check once built.
    let mut out = StringBuilder::with_capacity(n, n * 16);
    let mut bytes = 0usize;
    let mut text = String::with_capacity(32);
    let mut i = 0;
    while i < n {
        let end = if is_null(i) {
            i + 1
        } else {
            // The bounds of `v`'s unit (clamped to the range of i64, which cuts no run short
            // but the one that would end past it).
            let v = values[i];
            let r = v.rem_euclid(unit);
            let (start, stop) = (v.saturating_sub(r), v.saturating_add(unit - r));
            let mut end = i + 1;
            while end < n && !is_null(end) && (start..stop).contains(&values[end]) {
                end += 1;
            }
            end
        };
        let rows = end - i;
        // The run's text (`None`: NULL, or a timestamp chrono cannot represent).
        let formatted = (!is_null(i))
            .then(|| chrono::DateTime::from_timestamp_millis(values[i]))
            .flatten()
            .map(|dt| {
                text.clear();
                // Writing to a String cannot fail; the items were checked before.
                let _ = write!(text, "{}", dt.naive_utc().format_with_items(items.iter()));
                text.as_str()
            });
        match formatted {
            Some(text) => {
                // The run's last offset fits 32 bits, so every one before it does.
                bytes += text.len() * rows;
                offset(bytes)?;
                if rows >= REPEATED_RUN {
                    // The text repeated (about log2(rows) copies), then taken whole.
                    out.append_array(&StringArray::new_repeated(text, rows))?;
                } else {
                    (0..rows).for_each(|_| out.append_value(text));
                }
            }
            None => out.append_nulls(rows),
        }
        i = end;
    }
    Ok(out.finish())
}

/// The fewest rows of one text [`format_millis`] makes as one repeated piece rather than a row
/// at a time.
const REPEATED_RUN: usize = 8;

/// The text of every row of `ts` where all are valid and in one `unit` (a batch within one
/// day, for a daily pattern), formatted once; None otherwise. The rows' bounds are found by a
/// pass the compiler vectorizes, and the array is then made of one text repeated, with no pass
/// over its bytes to check them.
fn one_unit_text(
    ts: &arrow::array::TimestampMillisecondArray,
    items: &[chrono::format::Item],
    unit: i64,
) -> Option<String> {
    let values = ts.values();
    let first = *values.first()?;
    if ts.null_count() > 0 {
        return None;
    }
    let (lo, hi) = values
        .iter()
        .fold((first, first), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    // The end of `lo`'s unit, clamped as in `format_millis` (a unit that would end past the
    // range of i64 is left to it).
    if hi >= lo.saturating_add(unit - lo.rem_euclid(unit)) {
        return None;
    }
    let dt = chrono::DateTime::from_timestamp_millis(first)?;
    Some(dt.naive_utc().format_with_items(items.iter()).to_string())
}

/// A string array offset for `len` bytes of text.
fn offset(len: usize) -> DFResult<i32> {
    i32::try_from(len).map_err(|_| {
        DataFusionError::Execution("DATE_FORMAT: more than 2 GiB of text in one batch".into())
    })
}

/// `DATE_FORMAT(timestamp, 'pattern')` → STRING, with Flink's (Java's) pattern letters.
#[derive(Debug, PartialEq, Eq, Hash)]
struct DateFormat {
    signature: Signature,
}

impl ScalarUDFImpl for DateFormat {
    fn name(&self) -> &str {
        "date_format"
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, args: &[DataType]) -> DFResult<DataType> {
        match args {
            [
                DataType::Timestamp(_, _) | DataType::Date32 | DataType::Date64 | DataType::Utf8,
                DataType::Utf8,
            ] => Ok(DataType::Utf8),
            _ => plan_err!(
                "DATE_FORMAT takes a TIMESTAMP or DATE and a STRING pattern, got {args:?}"
            ),
        }
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DFResult<ColumnarValue> {
        let n = args.number_rows;
        let [value, pattern] = args.args.as_slice() else {
            return exec_err!("DATE_FORMAT takes two arguments");
        };
        let ColumnarValue::Scalar(ScalarValue::Utf8(Some(pattern))) = pattern else {
            return exec_err!("DATE_FORMAT's pattern must be a string literal");
        };
        let (fmt, unit) = translate(pattern)
            .map_err(|e| DataFusionError::Execution(format!("DATE_FORMAT: {e}")))?;
        let items: Vec<chrono::format::Item> = chrono::format::StrftimeItems::new(&fmt).collect();
        if items
            .iter()
            .any(|i| matches!(i, chrono::format::Item::Error))
        {
            return exec_err!("DATE_FORMAT: bad pattern '{pattern}'");
        }
        let values = value.to_array(n)?;
        let ts = arrow::compute::cast(&values, &DataType::Timestamp(TimeUnit::Millisecond, None))?;
        let ts = ts.as_primitive::<TimestampMillisecondType>();
        let out = format_millis(ts, &items, unit)?;
        Ok(ColumnarValue::Array(Arc::new(out) as ArrayRef))
    }
}

/// `MOD(a, b)`: the remainder of `a / b`, with `b`'s type (Flink's), negative only when `a` is.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Mod {
    signature: Signature,
}

impl ScalarUDFImpl for Mod {
    fn name(&self) -> &str {
        "mod"
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn coerce_types(&self, args: &[DataType]) -> DFResult<Vec<DataType>> {
        match args {
            [a, b] if a.is_integer() && b.is_integer() => Ok(vec![b.clone(), b.clone()]),
            [a, b] if a.is_numeric() && b.is_numeric() => {
                Ok(vec![DataType::Float64, DataType::Float64])
            }
            _ => plan_err!("MOD takes two numbers, got {args:?}"),
        }
    }
    fn return_type(&self, args: &[DataType]) -> DFResult<DataType> {
        Ok(args.get(1).cloned().unwrap_or(DataType::Int64))
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DFResult<ColumnarValue> {
        let n = args.number_rows;
        let [a, b] = args.args.as_slice() else {
            return exec_err!("MOD takes two arguments");
        };
        let (a, b) = (a.to_array(n)?, b.to_array(n)?);
        Ok(ColumnarValue::Array(arrow::compute::kernels::numeric::rem(
            &a, &b,
        )?))
    }
}

/// The Flink functions added to DataFusion's.
pub fn flink_udfs() -> Vec<Arc<ScalarUDF>> {
    vec![
        Arc::new(ScalarUDF::from(DateFormat {
            signature: Signature::any(2, Volatility::Immutable),
        })),
        Arc::new(ScalarUDF::from(Mod {
            signature: Signature::user_defined(Volatility::Immutable),
        })),
    ]
}

#[cfg(test)]
mod tests {
    use super::{DAY_MS, HOUR_MS, MINUTE_MS, format_millis, java_to_chrono, translate};
    use arrow::array::{Array, TimestampMillisecondArray};
    use rand::{Rng, SeedableRng};

    #[test]
    fn finest_units() {
        assert_eq!(translate("yyyy-MM-dd").unwrap().1, DAY_MS);
        assert_eq!(translate("EEE, D").unwrap().1, DAY_MS);
        assert_eq!(translate("HH:mm").unwrap().1, MINUTE_MS);
        assert_eq!(translate("yyyy h a").unwrap().1, HOUR_MS);
        assert_eq!(translate("ss").unwrap().1, 1_000);
        assert_eq!(translate("HH:mm:ss.SSS").unwrap().1, 1);
        assert_eq!(translate("'HH' yyyy").unwrap().1, DAY_MS);
    }

    /// Formatting once per unit gives what formatting every row does: runs in time order (and
    /// one of thousands of rows), jumps back and forth, negative timestamps, NULLs and
    /// timestamps chrono cannot represent.
    #[test]
    fn formatting_per_unit_equals_per_row() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut values: Vec<Option<i64>> = vec![Some(i64::MAX), Some(i64::MIN), Some(-1), Some(0)];
        let mut t: i64 = -3 * DAY_MS;
        for _ in 0..5_000 {
            t += rng.random_range(0..20 * MINUTE_MS);
            values.push(match rng.random_range(0..20) {
                0 => None,
                1 => Some(-t),
                2 => Some(i64::MAX - rng.random_range(0..1000)),
                _ => Some(t),
            });
        }
        values.extend(std::iter::repeat_n(Some(t), 3_000));
        values.push(Some(t + 1));
        let ts = TimestampMillisecondArray::from(values);
        // The whole array, its tail in one unit, and short windows (most within one day,
        // some crossing one, some holding a NULL or an unrepresentable timestamp): a batch
        // within one unit is made of one text repeated.
        let mut batches = vec![ts.clone(), ts.slice(ts.len() - 3_001, 3_000)];
        for _ in 0..300 {
            let len = rng.random_range(1..60);
            batches.push(ts.slice(rng.random_range(0..ts.len() - len), len));
        }
        for pattern in ["yyyy-MM-dd", "HH:mm", "h a", "ss.SSS", "EEEE D yy"] {
            let (fmt, unit) = translate(pattern).unwrap();
            let items: Vec<_> = chrono::format::StrftimeItems::new(&fmt).collect();
            for ts in &batches {
                let got = format_millis(ts, &items, unit).unwrap();
                for i in 0..ts.len() {
                    let want = ts.is_valid(i).then(|| ts.value(i)).and_then(|v| {
                        chrono::DateTime::from_timestamp_millis(v)
                            .map(|dt| dt.naive_utc().format(&fmt).to_string())
                    });
                    let have = got.is_valid(i).then(|| got.value(i).to_string());
                    assert_eq!(have, want, "{pattern} at row {i} of {}", ts.len());
                }
            }
        }
    }

    #[test]
    fn java_patterns() {
        assert_eq!(java_to_chrono("yyyy-MM-dd").unwrap(), "%Y-%m-%d");
        assert_eq!(
            java_to_chrono("yyyy-MM-dd HH:mm:ss.SSS").unwrap(),
            "%Y-%m-%d %H:%M:%S.%3f"
        );
        assert_eq!(java_to_chrono("'day' d, 100%").unwrap(), "day %-d, 100%%");
        assert!(java_to_chrono("yyyy-QQ").is_err());
    }
}
