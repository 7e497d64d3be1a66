//! The invariant for one `GroupAggregate`: insert-only and retracting streams over every key
//! type and mini-batch size, `-U` switched off (upserts by key), groups deleted and reborn, and a
//! TTL that never expires.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tally::changelog::ChangeBatch;

use super::{
    KeyType, Keys, Upserted, aggregates, key_exprs, random_stream, reference, schema, to_batch,
};
use crate::common::{Materialized, build, config, test_seed};

#[allow(clippy::too_many_arguments)]
fn check(
    seed: u64,
    retractions: bool,
    keys: Keys,
    key_type: KeyType,
    mini_batch: Option<usize>,
    update_before: bool,
    len: usize,
    n_keys: usize,
) {
    check_with(
        seed,
        retractions,
        keys,
        key_type,
        mini_batch,
        update_before,
        len,
        n_keys,
        None,
    );
}

#[allow(clippy::too_many_arguments)]
fn check_with(
    seed: u64,
    retractions: bool,
    keys: Keys,
    key_type: KeyType,
    mini_batch: Option<usize>,
    update_before: bool,
    len: usize,
    n_keys: usize,
    ttl: Option<&str>,
) {
    let ctx = format!(
        "seed {seed} retractions {retractions} keys {keys:?} {key_type:?} mini-batch {mini_batch:?} ub {update_before} ttl {ttl:?}"
    );
    let mut cfg = config(mini_batch, update_before);
    if let Some(ttl) = ttl {
        cfg.set("table.exec.state.ttl", ttl).unwrap();
    }
    let mut rng = StdRng::seed_from_u64(test_seed(seed));
    let stream = random_stream(&mut rng, len, retractions, n_keys);
    let schema = schema(key_type, retractions);
    let (mut agg, _clock) = build(&schema, key_exprs(keys), aggregates(), cfg);
    let n_out_keys = key_exprs(keys).len();
    let mut retract_view = Materialized::default();
    let mut upsert_view = Upserted::default();
    let apply = |rv: &mut Materialized, uv: &mut Upserted, batches: &[ChangeBatch]| {
        if update_before {
            rv.apply(batches);
        } else {
            uv.apply(batches, n_out_keys);
        }
    };
    let view = |rv: &Materialized, uv: &Upserted| if update_before { rv.rows() } else { uv.rows() };
    let mut pushed = 0;
    while pushed < stream.len() {
        let n = rng.random_range(0..=40).min(stream.len() - pushed);
        let batch = to_batch(
            &schema,
            key_type,
            &stream[pushed..pushed + n],
            rng.random_bool(0.5),
        );
        let out = agg.push(&batch).unwrap();
        apply(&mut retract_view, &mut upsert_view, &out);
        pushed += n;
        // Rows whose mini-batch has fired (the clock never moves, so only the size trigger fires).
        let fired = match mini_batch {
            None => pushed,
            Some(size) => pushed / size * size,
        };
        assert_eq!(
            view(&retract_view, &upsert_view),
            reference(&stream[..fired], keys),
            "{ctx}: after {pushed} rows"
        );
    }
    let out = agg.finish().unwrap();
    apply(&mut retract_view, &mut upsert_view, &out);
    assert_eq!(
        view(&retract_view, &upsert_view),
        reference(&stream, keys),
        "{ctx}: at the end"
    );
    let live_groups = reference(&stream, keys).len() as u64;
    assert_eq!(
        agg.metrics().keys_in_state,
        live_groups,
        "{ctx}: keys in state"
    );
}

const MINI_BATCHES: [Option<usize>; 5] = [None, Some(1), Some(3), Some(17), Some(100_000)];

#[test]
fn insert_only_matches_reference() {
    for (i, mb) in MINI_BATCHES.into_iter().enumerate() {
        for (j, kt) in [KeyType::Utf8, KeyType::Dictionary, KeyType::Int64]
            .into_iter()
            .enumerate()
        {
            check(
                100 + (i * 3 + j) as u64,
                false,
                Keys::One,
                kt,
                mb,
                true,
                300,
                12,
            );
        }
        check(
            200 + i as u64,
            false,
            Keys::Two,
            KeyType::Utf8,
            mb,
            true,
            300,
            12,
        );
        check(
            300 + i as u64,
            false,
            Keys::Global,
            KeyType::Utf8,
            mb,
            true,
            200,
            12,
        );
    }
}

#[test]
fn retractions_match_reference() {
    for (i, mb) in MINI_BATCHES.into_iter().enumerate() {
        for (j, kt) in [KeyType::Utf8, KeyType::Dictionary, KeyType::Int64]
            .into_iter()
            .enumerate()
        {
            check(
                400 + (i * 3 + j) as u64,
                true,
                Keys::One,
                kt,
                mb,
                true,
                400,
                10,
            );
        }
        check(
            500 + i as u64,
            true,
            Keys::Two,
            KeyType::Dictionary,
            mb,
            true,
            400,
            6,
        );
        check(
            600 + i as u64,
            true,
            Keys::Global,
            KeyType::Utf8,
            mb,
            true,
            250,
            6,
        );
    }
}

#[test]
fn upsert_changelog_without_update_before_matches_reference() {
    for (i, mb) in MINI_BATCHES.into_iter().enumerate() {
        check(
            700 + i as u64,
            true,
            Keys::One,
            KeyType::Utf8,
            mb,
            false,
            400,
            10,
        );
        check(
            800 + i as u64,
            false,
            Keys::Two,
            KeyType::Int64,
            mb,
            false,
            300,
            10,
        );
    }
}

/// Few keys and long streams: groups are deleted and come back many times.
#[test]
fn groups_deleted_and_reborn_match_reference() {
    for (i, mb) in MINI_BATCHES.into_iter().enumerate() {
        check(
            900 + i as u64,
            true,
            Keys::One,
            KeyType::Utf8,
            mb,
            true,
            1500,
            2,
        );
    }
}

/// A TTL that never expires (the clock does not move) changes the changelog (unchanged values are
/// re-emitted) but not the result.
#[test]
fn unexpired_ttl_matches_reference() {
    for (i, mb) in MINI_BATCHES.into_iter().enumerate() {
        check_with(
            1000 + i as u64,
            true,
            Keys::One,
            KeyType::Utf8,
            mb,
            true,
            300,
            6,
            Some("1 h"),
        );
        check_with(
            1100 + i as u64,
            false,
            Keys::One,
            KeyType::Utf8,
            mb,
            false,
            300,
            6,
            Some("1 h"),
        );
    }
}
