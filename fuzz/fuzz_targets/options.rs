//! Arbitrary `(key, value)` pairs through `Config::set`, `Config::reset`, `Config::validate` and
//! `Config::from_pairs`, and the same pairs as SQL `SET 'k' = 'v'` / `RESET 'k'` statements.
//!
//! Invariants besides "no panic":
//! - what `Config::entries` prints (as `SET` lists it) sets back to an equal configuration
//!   (durations compared at the millisecond, the unit it prints);
//! - `SET 'k' = 'v'` in a session accepts exactly what `Config::set(k, v)` accepts, with the same
//!   result (for keys and values that need no quoting).
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tally::Config;
use tally::config::{KEYS, parse_duration};
use tally::sql::Session;

#[derive(Arbitrary, Debug)]
enum Key {
    Known(u8),
    Raw(String),
}

impl Key {
    fn get(&self) -> String {
        match self {
            Key::Known(i) => KEYS[*i as usize % KEYS.len()].to_string(),
            Key::Raw(s) => s.clone(),
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Value {
    Raw(String),
    Int(i64),
    Uint(u64),
    Float(f64),
    Bool(bool, bool),
    Duration(u64, u8, bool),
}

const UNITS: &[&str] = &[
    "", "ms", "s", "min", "m", "h", "d", "ns", "us", "µs", "µS", "MS", "seconds", "days", "x",
];

impl Value {
    fn get(&self) -> String {
        match self {
            Value::Raw(s) => s.clone(),
            Value::Int(i) => i.to_string(),
            Value::Uint(u) => u.to_string(),
            Value::Float(f) => f.to_string(),
            Value::Bool(b, upper) => {
                let s = b.to_string();
                if *upper { s.to_uppercase() } else { s }
            }
            Value::Duration(n, unit, space) => format!(
                "{n}{}{}",
                if *space { " " } else { "" },
                UNITS[*unit as usize % UNITS.len()]
            ),
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Op {
    Set(Key, Value),
    Reset(Key),
    ResetAll,
}

fn same(a: &Config, b: &Config) -> bool {
    let ms = |c: &Config| {
        (
            c.mini_batch_allow_latency.as_millis(),
            c.state_ttl.as_millis(),
        )
    };
    let mut a2 = a.clone();
    let mut b2 = b.clone();
    a2.mini_batch_allow_latency = Default::default();
    a2.state_ttl = Default::default();
    b2.mini_batch_allow_latency = Default::default();
    b2.state_ttl = Default::default();
    ms(a) == ms(b) && a2 == b2
}

fn plain(s: &str) -> bool {
    !s.is_empty()
        && s.trim() == s
        && !s.contains(['\'', '"', '`', '=', ';', '-', '/'])
        && !s.chars().any(char::is_whitespace)
}

fuzz_target!(|ops: Vec<Op>| {
    let mut config = Config::default();
    let mut session = Session::new();
    let mut pairs = vec![];
    for op in ops.iter().take(64) {
        match op {
            Op::Set(k, v) => {
                let (k, v) = (k.get(), v.get());
                let _ = parse_duration(&k, &v);
                let direct = config.set(&k, &v);
                pairs.push((k.clone(), v.clone()));
                let stmt = format!(
                    "SET '{}' = '{}'",
                    k.replace('\'', "''"),
                    v.replace('\'', "''")
                );
                let via_sql = session.execute(&stmt);
                if plain(&k) && !v.contains('\'') && !v.is_empty() && v.trim() == v {
                    assert_eq!(
                        direct.is_ok(),
                        via_sql.is_ok(),
                        "{stmt}: {direct:?} vs {via_sql:?}"
                    );
                }
                let _ = session.execute(&format!("SET {k} = {v}"));
            }
            Op::Reset(k) => {
                let k = k.get();
                let direct = config.reset(&k);
                let via_sql = session.execute(&format!("RESET '{}'", k.replace('\'', "''")));
                if plain(&k) {
                    assert_eq!(direct.is_ok(), via_sql.is_ok(), "RESET {k}");
                }
            }
            Op::ResetAll => {
                config = Config::default();
                let _ = session.execute("RESET");
            }
        }
        let _ = config.validate();
        // What SET lists sets back to the same configuration.
        let mut again = Config::default();
        for (k, v) in config.entries() {
            again
                .set(k, &v)
                .unwrap_or_else(|e| panic!("entry '{k}' = '{v}' does not set back: {e}"));
        }
        assert!(same(&config, &again), "{config:?} vs {again:?}");
        let _ = session.execute("SET");
    }
    let _ = Config::from_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
});
