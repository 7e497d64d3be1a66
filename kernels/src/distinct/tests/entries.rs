//! A DISTINCT accumulator's live entries placed in output rows of the caller's choosing
//! (a split PARTIAL's flush by worker), and the buckets of their values.

use super::super::*;
use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Int64Array, ListArray, StructArray};
use arrow_buffer::BooleanBuffer;

/// Entries placed in rows by their group and value (a split PARTIAL's flush by worker): every
/// row lists exactly the live entries placed in it, with the counters the group's own list
/// gives them, for flags (insert-only), bare pairs, counters (retractable) and string values;
/// merged into a global phase, the rows of a group give its results. A row past the rows, or
/// too few rows for the entries, is refused.
#[test]
fn entries_placed_in_rows_are_the_groups_entries() {
    let mut rng = crate::test_rng::XorShift(0x3c6e_f372_fe94_f82bu64);
    let mut rand = move || rng.next();
    for (arg, k, retractable) in [
        (DataType::Int64, 2, false),
        (DataType::Int64, 1, false),
        (DataType::Int64, 2, true),
        (DataType::Utf8, 2, false),
    ] {
        let kinds = vec![AggregateKind::Count; k];
        let mut acc = DistinctAccumulator::try_new(&arg, &kinds, retractable).unwrap();
        acc.for_local_phase();
        let groups = 3u32;
        let n = 500;
        let raw: Vec<Option<i64>> = (0..n)
            .map(|_| {
                let v = (rand() % 150) as i64;
                (v % 31 != 0).then_some(v)
            })
            .collect();
        let values: ArrayRef = match arg {
            DataType::Utf8 => Arc::new(arrow_array::StringArray::from_iter(
                raw.iter().map(|v| v.map(|v| format!("v{v}"))),
            )),
            _ => Arc::new(Int64Array::from(raw.clone())),
        };
        let gids: Vec<u32> = (0..n).map(|_| (rand() % 3) as u32).collect();
        let odd = BooleanBuffer::collect_bool(n, |i| i % 2 == 1);
        let filters: Vec<Option<&BooleanBuffer>> =
            (0..k).map(|j| (j == 1).then_some(&odd)).collect();
        acc.apply(&values, &gids, &filters, groups as usize, 1)
            .unwrap();

        let entries = acc.live_entries().unwrap();
        let (entry_groups, entry_values) = (&entries.groups, &entries.values().unwrap());
        assert_eq!(entry_groups.len(), entry_values.len());
        // Two rows per group, chosen by the value's parity.
        let parity = |i: usize| match arg {
            DataType::Utf8 => {
                let s = entry_values.as_string::<i32>().value(i);
                s[1..].parse::<u64>().unwrap() % 2
            }
            _ => entry_values.as_primitive::<Int64Type>().value(i) as u64 % 2,
        };
        let row_of: Vec<u32> = (0..entry_groups.len())
            .map(|i| entry_groups[i] * 2 + parity(i) as u32)
            .collect();
        let placed = acc
            .state_placed(&entries, 2 * groups as usize, &row_of)
            .unwrap();
        let all: Vec<u32> = (0..groups).collect();
        let whole = acc.state(&all).unwrap();
        let entries_of = |state: &ArrayRef, row: usize| -> Vec<(String, Vec<i64>)> {
            let lists = state.as_any().downcast_ref::<ListArray>().unwrap();
            let e = lists.value(row);
            let e = e.as_any().downcast_ref::<StructArray>().unwrap();
            let text = arrow_cast::display::ArrayFormatter::try_new(
                e.column(0).as_ref(),
                &Default::default(),
            )
            .unwrap();
            let mut out: Vec<(String, Vec<i64>)> = (0..arrow_array::Array::len(e))
                .map(|i| {
                    let counts = (1..=k)
                        .map(|c| e.column(c).as_primitive::<Int64Type>().value(i))
                        .collect();
                    (text.value(i).to_string(), counts)
                })
                .collect();
            out.sort();
            out
        };
        for g in 0..groups as usize {
            let mut rows = entries_of(&placed, 2 * g);
            let odd_rows = entries_of(&placed, 2 * g + 1);
            let digits = |s: &str| s.trim_start_matches('v').parse::<u64>().unwrap();
            assert!(rows.iter().all(|(v, _)| digits(v) % 2 == 0), "{arg} k={k}");
            assert!(
                odd_rows.iter().all(|(v, _)| digits(v) % 2 == 1),
                "{arg} k={k}"
            );
            rows.extend(odd_rows);
            rows.sort();
            assert_eq!(rows, entries_of(&whole, g), "{arg} k={k}, group {g}");
            assert!(!rows.is_empty());
        }
        // The rows merged into a global phase give each group's results.
        let mut global = DistinctAccumulator::try_new(&arg, &kinds, retractable).unwrap();
        let owners: Vec<u32> = (0..2 * groups).map(|r| r / 2).collect();
        global.merge(&placed, &owners, groups as usize).unwrap();
        let mut reference = DistinctAccumulator::try_new(&arg, &kinds, retractable).unwrap();
        reference.merge(&whole, &all, groups as usize).unwrap();
        assert_eq!(
            global.evaluate(&all).unwrap(),
            reference.evaluate(&all).unwrap()
        );

        let mut past = row_of.clone();
        past[0] = 2 * groups;
        assert!(
            acc.state_placed(&entries, 2 * groups as usize, &past)
                .is_err()
        );
        assert!(
            acc.state_placed(&entries, 2 * groups as usize, &row_of[1..])
                .is_err()
        );
    }
}

/// Entries placed in one row, in a few (each placed in a pass of its own) or in many (counted
/// and placed once): each row lists the same entries, in the same order, whichever way it is
/// placed. A few rows are checked against the same rows among many empty ones; rows left
/// empty among the few get empty lists. Flags (insert-only), counters and one aggregate.
#[test]
fn entries_are_placed_alike_in_one_a_few_or_many_rows() {
    let mut rng = crate::test_rng::XorShift(0x510e_527f_ade6_82d1u64);
    let mut rand = move || rng.next();
    for (k, retractable) in [(2, false), (3, true), (1, false)] {
        let kinds = vec![AggregateKind::Count; k];
        let mut acc = DistinctAccumulator::try_new(&DataType::Int64, &kinds, retractable).unwrap();
        acc.for_local_phase();
        let n = 700;
        let values: ArrayRef = Arc::new(Int64Array::from_iter_values(
            (0..n).map(|_| (rand() % 300) as i64),
        ));
        let gids: Vec<u32> = (0..n).map(|_| (rand() % 2) as u32).collect();
        let odd = BooleanBuffer::collect_bool(n, |i| i % 3 == 1);
        let filters: Vec<Option<&BooleanBuffer>> =
            (0..k).map(|j| (j == 1).then_some(&odd)).collect();
        acc.apply(&values, &gids, &filters, 2, 1).unwrap();
        let entries = acc.live_entries().unwrap();
        let len = entries.groups.len();
        let lists = |state: &ArrayRef, rows: usize| -> Vec<Vec<String>> {
            let l = state.as_any().downcast_ref::<ListArray>().unwrap();
            (0..rows)
                .map(|r| {
                    let e = l.value(r);
                    let e = e.as_any().downcast_ref::<StructArray>().unwrap();
                    (0..arrow_array::Array::len(e))
                        .map(|i| {
                            (0..=k)
                                .map(|c| e.column(c).as_primitive::<Int64Type>().value(i))
                                .map(|v| v.to_string())
                                .collect::<Vec<_>>()
                                .join(",")
                        })
                        .collect()
                })
                .collect()
        };
        for rows in 1..=6usize {
            // Every other row left empty where there are more than two.
            let row_of: Vec<u32> = (0..len)
                .map(|_| {
                    let r = (rand() % rows as u64) as u32;
                    if rows > 2 { r & !1 } else { r }
                })
                .collect();
            let few = acc.state_placed(&entries, rows, &row_of).unwrap();
            let many = acc.state_placed(&entries, rows + 8, &row_of).unwrap();
            let (few, many) = (lists(&few, rows), lists(&many, rows + 8));
            assert_eq!(few[..], many[..rows], "k={k}, {rows} rows");
            assert!(many[rows..].iter().all(Vec::is_empty));
            assert_eq!(few.iter().map(Vec::len).sum::<usize>(), len);
            if rows > 2 {
                assert!(few.iter().skip(1).step_by(2).all(Vec::is_empty));
            }
        }
    }
}

/// The buckets of a table's entries, read from their bits where the values are 32- or 64-bit
/// integers, are the buckets of the values themselves, negative values included; for other
/// types they are read from the values.
#[test]
fn entry_buckets_are_the_buckets_of_their_values() {
    let arrays: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(
            (0..400i64).map(|v| (v - 200) * 7_919 + (v << 40)),
        )),
        Arc::new(arrow_array::Int32Array::from_iter_values(
            (0..400i32).map(|v| (v - 200) * 104_729),
        )),
        Arc::new(arrow_array::StringArray::from_iter_values(
            (0..400).map(|v| format!("v{v}")),
        )),
    ];
    for values in arrays {
        let mut acc =
            DistinctAccumulator::try_new(values.data_type(), &[AggregateKind::Count], false)
                .unwrap();
        acc.for_local_phase();
        let gids: Vec<u32> = (0..values.len() as u32).map(|i| i % 3).collect();
        acc.apply(&values, &gids, &[None], 3, 1).unwrap();
        let entries = acc.live_entries().unwrap();
        for buckets in [1u32, 16, 1024, 1000] {
            let expected = crate::hash::bucket_array(&entries.values().unwrap(), buckets).unwrap();
            assert_eq!(
                entries.buckets(buckets).unwrap(),
                expected.values().to_vec(),
                "{} values, {buckets} buckets",
                values.data_type()
            );
        }
        assert!(entries.buckets(0).is_err());
    }
}
