//! Flink scalar functions that DataFusion lacks: `DATE_FORMAT` (with Java's pattern letters)
//! and `MOD`.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, StringBuilder};
use arrow::datatypes::{DataType, TimeUnit, TimestampMillisecondType};
use datafusion_common::{DataFusionError, Result as DFResult, ScalarValue, exec_err, plan_err};
use datafusion_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

/// Converts a Java `SimpleDateFormat` pattern (`yyyy-MM-dd HH:mm:ss.SSS`) into a chrono format
/// string.
pub fn java_to_chrono(pattern: &str) -> Result<String, String> {
    let chars: Vec<char> = pattern.chars().collect();
    let mut out = String::new();
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
        out.push_str(&spec);
        i += n;
    }
    Ok(out)
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
        let fmt = java_to_chrono(pattern)
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
        let mut out = StringBuilder::with_capacity(n, n * 16);
        for i in 0..ts.len() {
            if ts.is_null(i) {
                out.append_null();
                continue;
            }
            match chrono::DateTime::from_timestamp_millis(ts.value(i)) {
                Some(dt) => {
                    out.append_value(dt.naive_utc().format_with_items(items.iter()).to_string())
                }
                None => out.append_null(),
            }
        }
        Ok(ColumnarValue::Array(Arc::new(out.finish()) as ArrayRef))
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
    use super::java_to_chrono;

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
