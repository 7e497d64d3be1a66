//! The JNI entry points of `org.tally.flink.Native`: each Java operator holds a handle to its
//! phase here, and every call moves one batch (or one checkpoint's parts) across, never a row.
//!
//! Handles are numbers into a table of phases, so no Java value is ever a Rust pointer: a stale
//! or foreign handle is an error, not memory corruption. Every error, and any panic, comes back
//! to Java as an `org.tally.flink.TallyException` with a one-line message.
//!
//! A part (one key group's rows, exchanged between the phases and kept in Flink's raw keyed
//! state) travels as one byte array: its key group as a little-endian u32, then its Arrow IPC
//! bytes.
//!
//! The exported functions need `#[no_mangle]`, which the workspace's `unsafe_code` lint counts
//! as unsafe: this file is the only one that allows it, and it holds no `unsafe` block.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use jni::JNIEnv;
use jni::objects::{JByteArray, JClass, JObject, JObjectArray, JString};
use jni::sys::{jboolean, jint, jlong, jobjectArray};

use crate::parts::Part;
use crate::phases::{Output, Phase};
use crate::query::{Column, Query};
use crate::wire::Type;

const EXCEPTION: &str = "org/tally/flink/TallyException";

type Table = HashMap<i64, Arc<Mutex<Phase>>>;

static PHASES: LazyLock<Mutex<Table>> = LazyLock::new(|| Mutex::new(HashMap::new()));
static NEXT: AtomicI64 = AtomicI64::new(1);

/// What an entry point fails with: a message for the Java exception.
type Outcome<T> = std::result::Result<T, String>;

fn msg(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn phase(handle: jlong) -> Outcome<Arc<Mutex<Phase>>> {
    let table = PHASES
        .lock()
        .map_err(|_| "the handle table is poisoned".to_string())?;
    table
        .get(&handle)
        .cloned()
        .ok_or_else(|| format!("no Tally operator has handle {handle} (closed already?)"))
}

fn with_phase<T>(handle: jlong, f: impl FnOnce(&mut Phase) -> Outcome<T>) -> Outcome<T> {
    let p = phase(handle)?;
    let mut p = p
        .lock()
        .map_err(|_| "this Tally operator failed earlier and cannot be used".to_string())?;
    f(&mut p)
}

/// Runs an entry point: its error or panic becomes a Java exception, and `fallback` the value
/// returned to Java beside it.
fn guard<T>(env: &mut JNIEnv, fallback: T, f: impl FnOnce(&mut JNIEnv) -> Outcome<T>) -> T {
    let result = catch_unwind(AssertUnwindSafe(|| f(env)));
    let message = match result {
        Ok(Ok(v)) => return v,
        Ok(Err(m)) => m,
        Err(panic) => {
            let what = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            format!("internal error in the Tally operator (a bug): {what}")
        }
    };
    if !env.exception_check().unwrap_or(false) {
        let _ = env.throw_new(EXCEPTION, message);
    }
    fallback
}

fn string(env: &mut JNIEnv, s: &JString) -> Outcome<String> {
    Ok(env.get_string(s).map_err(msg)?.into())
}

fn strings(env: &mut JNIEnv, array: &JObjectArray) -> Outcome<Vec<String>> {
    let n = env.get_array_length(array).map_err(msg)?;
    let mut out = Vec::with_capacity(n as usize);
    for i in 0..n {
        let e = JString::from(env.get_object_array_element(array, i).map_err(msg)?);
        out.push(string(env, &e)?);
        env.delete_local_ref(e).map_err(msg)?;
    }
    Ok(out)
}

fn byte_arrays(env: &mut JNIEnv, rows: &[Vec<u8>]) -> Outcome<jobjectArray> {
    let out = env
        .new_object_array(rows.len() as i32, "[B", JObject::null())
        .map_err(msg)?;
    for (i, r) in rows.iter().enumerate() {
        let b = env.byte_array_from_slice(r).map_err(msg)?;
        env.set_object_array_element(&out, i as i32, &b)
            .map_err(msg)?;
        env.delete_local_ref(b).map_err(msg)?;
    }
    Ok(out.into_raw())
}

/// A call on a phase that returns byte arrays to Java.
fn arrays_from(
    env: &mut JNIEnv,
    handle: jlong,
    f: impl FnOnce(&mut Phase) -> tally::Result<Vec<Vec<u8>>>,
) -> jobjectArray {
    guard(env, std::ptr::null_mut(), |env| {
        let out = with_phase(handle, |p| f(p).map_err(msg))?;
        byte_arrays(env, &out)
    })
}

/// A part as it crosses to Java: its key group, then its bytes.
fn framed(parts: Vec<Part>) -> Vec<Vec<u8>> {
    parts
        .into_iter()
        .map(|p| {
            let mut b = Vec::with_capacity(4 + p.bytes.len());
            b.extend_from_slice(&p.key_group.to_le_bytes());
            b.extend_from_slice(&p.bytes);
            b
        })
        .collect()
}

/// What a phase hands on, for Java: framed parts, or column batches from the last phase.
fn handed_on(out: Output) -> Vec<Vec<u8>> {
    if out.parts.is_empty() {
        out.rows
    } else {
        framed(out.parts)
    }
}

fn unframed(bytes: &[u8]) -> Outcome<&[u8]> {
    bytes
        .get(4..)
        .ok_or_else(|| "a part from Flink is shorter than its key group".to_string())
}

/// `long open(String sql, String table, String[] columns, boolean changelog, String[] options,
/// int phase, int receivers)`: plans the query and opens one phase of its chain (0 before the
/// first exchange), which sends to a keyed operator of `receivers` subtasks
/// ([`Phase::with_receivers`]). `columns` holds a name, a Flink type and `NULL`/`NOT NULL` per
/// column; `options` holds keys and values in turn.
#[unsafe(no_mangle)]
pub extern "system" fn Java_org_tally_flink_Native_open<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    sql: JString<'l>,
    table: JString<'l>,
    columns: JObjectArray<'l>,
    changelog: jboolean,
    options: JObjectArray<'l>,
    phase: jint,
    receivers: jint,
) -> jlong {
    guard(&mut env, 0, |env| {
        let query = plan(env, &sql, &table, &columns, changelog != 0, &options)?;
        let k = usize::try_from(phase).map_err(|_| format!("phase {phase}"))?;
        let receivers = usize::try_from(receivers).unwrap_or(0);
        let phase = query.into_phase(k).map_err(msg)?.with_receivers(receivers);
        let handle = NEXT.fetch_add(1, Ordering::Relaxed);
        PHASES
            .lock()
            .map_err(|_| "the handle table is poisoned".to_string())?
            .insert(handle, Arc::new(Mutex::new(phase)));
        Ok(handle)
    })
}

fn plan(
    env: &mut JNIEnv,
    sql: &JString,
    table: &JString,
    columns: &JObjectArray,
    changelog: bool,
    options: &JObjectArray,
) -> Outcome<Query> {
    let sql = string(env, sql)?;
    let table = string(env, table)?;
    let cols = strings(env, columns)?;
    if cols.len() % 3 != 0 {
        return Err("columns come as name, type, nullability triples".into());
    }
    let columns = cols
        .chunks(3)
        .map(|c| {
            Ok(Column {
                name: c[0].clone(),
                ty: Type::parse(&c[1]).map_err(msg)?,
                nullable: c[2] != "NOT NULL",
            })
        })
        .collect::<Outcome<Vec<_>>>()?;
    let opts = strings(env, options)?;
    if opts.len() % 2 != 0 {
        return Err("options come as key, value pairs".into());
    }
    let opts: Vec<(String, String)> = opts
        .chunks(2)
        .map(|kv| (kv[0].clone(), kv[1].clone()))
        .collect();
    Query::plan(&sql, &table, &columns, changelog, &opts).map_err(msg)
}

/// `String[] describe(String sql, String table, String[] columns, boolean changelog, String[]
/// options)`: plans the query without opening a phase, for the job graph: the key groups, `TWO_PHASE`
/// or `ONE_PHASE` per aggregate (comma-separated: one keyed phase each), the rows of a column batch, the latency in milliseconds, the input columns the
/// query reads (comma-separated positions), then a name, type and nullability per result column.
#[unsafe(no_mangle)]
pub extern "system" fn Java_org_tally_flink_Native_describe<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    sql: JString<'l>,
    table: JString<'l>,
    columns: JObjectArray<'l>,
    changelog: jboolean,
    options: JObjectArray<'l>,
) -> jobjectArray {
    guard(&mut env, std::ptr::null_mut(), |env| {
        let query = plan(env, &sql, &table, &columns, changelog != 0, &options)?;
        let strategies: Vec<&str> = query
            .two_phase()
            .iter()
            .map(|&t| if t { "TWO_PHASE" } else { "ONE_PHASE" })
            .collect();
        let mut out = vec![
            query.key_groups().to_string(),
            strategies.join(","),
            query.batch_rows().to_string(),
            query.latency_ms().to_string(),
            query
                .columns_read()
                .iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(","),
        ];
        for c in query.output() {
            out.push(c.name.clone());
            out.push(c.ty.name().to_string());
            out.push(if c.nullable { "NULL" } else { "NOT NULL" }.to_string());
        }
        let array = env
            .new_object_array(out.len() as i32, "java/lang/String", JObject::null())
            .map_err(msg)?;
        for (i, s) in out.iter().enumerate() {
            let js = env.new_string(s).map_err(msg)?;
            env.set_object_array_element(&array, i as i32, &js)
                .map_err(msg)?;
            env.delete_local_ref(js).map_err(msg)?;
        }
        Ok(array.into_raw())
    })
}

/// `byte[][] push(long handle, byte[] bytes)`: phase 0 takes a column batch, a later phase a
/// part from its exchange; returns what became due: parts for the next exchange, or from the
/// last phase column batches of changes.
#[unsafe(no_mangle)]
pub extern "system" fn Java_org_tally_flink_Native_push<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    handle: jlong,
    bytes: JByteArray<'l>,
) -> jobjectArray {
    guard(&mut env, std::ptr::null_mut(), |env| {
        let input = env.convert_byte_array(&bytes).map_err(msg)?;
        let out = with_phase(handle, |p| {
            let bytes = if p.is_keyed() {
                unframed(&input)?
            } else {
                &input[..]
            };
            p.push(bytes).map_err(msg)
        })?;
        byte_arrays(env, &handed_on(out))
    })
}

/// `byte[][] flush(long handle)`: fires everything pending in the phase, as [`Phase::flush`].
#[unsafe(no_mangle)]
pub extern "system" fn Java_org_tally_flink_Native_flush<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    handle: jlong,
) -> jobjectArray {
    arrays_from(&mut env, handle, |p| p.flush().map(handed_on))
}

/// `byte[][] snapshot(long handle)`: a keyed phase's state, one part per key group.
#[unsafe(no_mangle)]
pub extern "system" fn Java_org_tally_flink_Native_snapshot<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    handle: jlong,
) -> jobjectArray {
    arrays_from(&mut env, handle, |p| p.snapshot().map(framed))
}

/// `void restore(long handle, byte[][] parts)`: loads the parts of the key groups Flink
/// assigned to this subtask into a fresh keyed phase.
#[unsafe(no_mangle)]
pub extern "system" fn Java_org_tally_flink_Native_restore<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    handle: jlong,
    parts: JObjectArray<'l>,
) {
    guard(&mut env, (), |env| {
        let n = env.get_array_length(&parts).map_err(msg)?;
        let mut owned = Vec::with_capacity(n as usize);
        for i in 0..n {
            let b = JByteArray::from(env.get_object_array_element(&parts, i).map_err(msg)?);
            owned.push(env.convert_byte_array(&b).map_err(msg)?);
            env.delete_local_ref(b).map_err(msg)?;
        }
        let slices = owned
            .iter()
            .map(|b| unframed(b))
            .collect::<Outcome<Vec<_>>>()?;
        with_phase(handle, |p| p.restore(&slices).map_err(msg))
    })
}

/// `long stateBytes(long handle)`: a phase's keyed state in bytes (0 for phase 0).
#[unsafe(no_mangle)]
pub extern "system" fn Java_org_tally_flink_Native_stateBytes<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    handle: jlong,
) -> jlong {
    guard(&mut env, 0, |_| {
        with_phase(handle, |p| Ok(p.state_bytes() as jlong))
    })
}

/// `void close(long handle)`: frees the phase; a second close does nothing.
#[unsafe(no_mangle)]
pub extern "system" fn Java_org_tally_flink_Native_close<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    handle: jlong,
) {
    guard(&mut env, (), |_| {
        PHASES
            .lock()
            .map_err(|_| "the handle table is poisoned".to_string())?
            .remove(&handle);
        Ok(())
    })
}
