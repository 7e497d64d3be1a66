//! EXPLAIN in Flink's names for what the SQL planner builds: the nodes of an aggregate (Calc,
//! LocalGroupAggregate, Exchange, GroupAggregate or GlobalGroupAggregate, with Flink's
//! attributes and accumulator names) and expressions as Flink prints them. The plan's text is
//! [`crate::explain::Explain`]'s.

use std::collections::HashMap;

use datafusion_common::ScalarValue;
use datafusion_expr::expr::{AggregateFunction, Alias, ScalarFunction};
use datafusion_expr::logical_plan::Aggregate;
use datafusion_expr::{BinaryExpr, Expr};
use tally_kernels::aggregates::AggregateKind;

use crate::error::{Error, Result};
use crate::explain::{AggregateStep, PlanNode};

/// What EXPLAIN needs to know about one aggregate besides its logical plan.
pub(super) struct AggregateShape<'a> {
    /// The aggregate's position among the pipeline's aggregates.
    pub index: usize,
    /// Aliases the projection above gives its results (output column → alias).
    pub aliases: &'a HashMap<String, String>,
    /// `PARTIAL` or `FINAL` for the parts of a split-distinct aggregate.
    pub partial_final: Option<&'static str>,
    /// Whether its input is a changelog.
    pub changelog: bool,
    /// Whether it runs in two phases.
    pub two_phase: bool,
    /// The changelog mode of its input.
    pub in_mode: Vec<&'static str>,
    /// The resolved kind of each call (COUNT(*) or COUNT(x), …).
    pub kinds: Vec<AggregateKind>,
    /// Whether each call is a MIN/MAX that ignores retractions ([`crate::plan::AggregateCall::monotonic`]):
    /// Flink shows it without `_RETRACT` over a changelog.
    pub monotonic: Vec<bool>,
    /// The accumulator names of each call (Flink's), for the local and global phases.
    pub acc_names: Option<Vec<Vec<String>>>,
    /// The name of the local phase's record count, when it keeps one.
    pub count1: Option<String>,
}

/// An aggregate's nodes and what the planner reads off them.
pub(super) struct AggregateNodes {
    /// Calc, [LocalGroupAggregate,] Exchange, then the keyed aggregate.
    pub nodes: Vec<PlanNode>,
    /// EXPLAIN names of the output columns, where they differ from the schema's.
    pub names: HashMap<String, String>,
    /// The group keys as shown.
    pub keys: Vec<String>,
    /// Whether a call is DISTINCT, and the DISTINCT arguments as shown.
    pub has_distinct: bool,
    pub distinct_args: Vec<String>,
}

/// One aggregate call as EXPLAIN shows it.
struct CallInfo {
    /// `SUM(amount)`, `COUNT(*)`, `COUNT(DISTINCT user_id)`.
    call: String,
    fname: String,
    args: Vec<String>,
    distinct: bool,
    /// MIN or MAX (planned without its DISTINCT).
    minmax: bool,
    /// Index into the filter columns.
    filter: Option<usize>,
    /// The output name.
    name: String,
}

/// The EXPLAIN nodes of `agg`: Calc (keys, arguments, filters), then [LocalGroupAggregate,]
/// Exchange, and GroupAggregate or GlobalGroupAggregate, in Flink's names.
///
/// # Errors
/// An aggregate expression that is not an aggregate call (a bug of the planner).
pub(super) fn aggregate_nodes(
    agg: &Aggregate,
    shape: AggregateShape<'_>,
) -> Result<AggregateNodes> {
    let AggregateShape {
        index,
        aliases,
        partial_final,
        changelog,
        two_phase,
        in_mode,
        kinds,
        monotonic,
        acc_names,
        count1: count1_name,
    } = shape;
    let mut names: HashMap<String, String> = HashMap::new();
    let keys: Vec<String> = agg.group_expr.iter().map(show).collect();
    let mut calc: Vec<String> = vec![];
    fn push_calc(calc: &mut Vec<String>, s: String) {
        if !calc.contains(&s) {
            calc.push(s);
        }
    }
    for k in &agg.group_expr {
        push_calc(&mut calc, show(k));
    }
    let mut filters: Vec<String> = vec![];
    let mut has_distinct = false;
    let mut distinct_args: Vec<String> = vec![];
    let mut calls: Vec<CallInfo> = vec![];
    for (i, a) in agg.aggr_expr.iter().enumerate() {
        let (inner, name) = match a {
            Expr::Alias(Alias { expr, name, .. }) => (expr.as_ref(), name.clone()),
            other => {
                let field = agg.schema.field(agg.group_expr.len() + i).name().clone();
                let name = aliases
                    .get(&field)
                    .cloned()
                    .unwrap_or_else(|| format!("EXPR${i}"));
                names.insert(field, name.clone());
                (other, name)
            }
        };
        let Expr::AggregateFunction(AggregateFunction { params, .. }) = inner else {
            return Err(Error::plan(format!("{inner} is not an aggregate call")));
        };
        let kind = kinds[i];
        // Flink marks the functions of an aggregate that consumes retractions, but for a
        // MIN/MAX whose argument only moves its way.
        let retracts = changelog && !monotonic[i];
        let fname = format!("{}{}", kind.name(), if retracts { "_RETRACT" } else { "" });
        let star = kind == AggregateKind::CountStar;
        let args: Vec<String> = if star {
            vec![]
        } else {
            params.args.iter().map(show).collect()
        };
        for a in &args {
            push_calc(&mut calc, a.clone());
        }
        let call = if star {
            "COUNT(*)".to_string()
        } else {
            format!(
                "{fname}({}{})",
                if params.distinct { "DISTINCT " } else { "" },
                args.join(", ")
            )
        };
        if params.distinct {
            has_distinct = true;
            distinct_args.extend(args.iter().cloned());
        }
        let filter = params.filter.as_ref().map(|f| {
            let f = format!("{} IS TRUE", show(f));
            match filters.iter().position(|x| *x == f) {
                Some(i) => i,
                None => {
                    filters.push(f);
                    filters.len() - 1
                }
            }
        });
        calls.push(CallInfo {
            call,
            fname,
            args,
            distinct: params.distinct,
            minmax: matches!(kind, AggregateKind::Min | AggregateKind::Max),
            filter,
            name,
        });
    }
    // Filter columns follow the keys and arguments in the Calc, as `$f<position>` (after any
    // `$f<n>` column of the input, such as a split's buckets and FILTER conditions).
    let input = agg.input.schema();
    let base = calc
        .iter()
        .map(String::as_str)
        .chain(input.fields().iter().map(|f| f.name().as_str()))
        .filter_map(|c| c.strip_prefix("$f").and_then(|n| n.parse::<usize>().ok()))
        .map(|n| n + 1)
        .chain([calc.len()])
        .max()
        .unwrap_or(0);
    let filter_of = |c: &CallInfo| {
        c.filter
            .map(|i| format!(" FILTER $f{}", base + i))
            .unwrap_or_default()
    };
    for (i, f) in filters.iter().enumerate() {
        calc.push(format!("{f} AS $f{}", base + i));
    }
    let mut select: Vec<String> = keys.clone();
    let mut local_select: Vec<String> = keys.clone();
    let mut global_select: Vec<String> = keys.clone();
    let mut distinct_sets: Vec<(String, String)> = vec![];
    for (j, c) in calls.iter().enumerate() {
        select.push(format!("{}{} AS {}", c.call, filter_of(c), c.name));
        let Some(accs) = acc_names.as_ref().and_then(|a| a.get(j)) else {
            continue;
        };
        let minmax = c.minmax;
        if c.distinct && !minmax {
            // DISTINCT calls over one argument share its value set (`distinct$k`).
            let set = accs.join(", ");
            let arg = c.args.join(", ");
            if !distinct_sets.iter().any(|d| d.1 == set) {
                distinct_sets.push((arg.clone(), set.clone()));
            }
            local_select.push(format!("{}({set} {arg}){}", c.fname, filter_of(c)));
            global_select.push(format!("{}({set} {arg}) AS {}", c.fname, c.name));
        } else {
            let accs = if accs.len() == 1 {
                accs[0].clone()
            } else {
                format!("({})", accs.join(", "))
            };
            local_select.push(format!("{}{} AS {accs}", c.call, filter_of(c)));
            global_select.push(format!("{}({accs}) AS {}", c.fname, c.name));
        }
    }
    if let Some(count1) = &count1_name {
        local_select.push(format!("COUNT(*) AS {count1}"));
    }
    for (arg, set) in &distinct_sets {
        local_select.push(format!("DISTINCT({arg}) AS {set}"));
    }
    let mut nodes = vec![PlanNode::step(
        index,
        AggregateStep::Calc,
        vec![format!("select=[{}]", calc.join(", "))],
        in_mode.clone(),
    )];
    let group_by = (!keys.is_empty()).then(|| format!("groupBy=[{}]", keys.join(", ")));
    let partial_final = partial_final.map(|t| format!("partialFinalType=[{t}]"));
    if two_phase {
        let mut attrs: Vec<String> = group_by.iter().cloned().collect();
        attrs.extend(partial_final.clone());
        attrs.push(format!("select=[{}]", local_select.join(", ")));
        nodes.push(PlanNode::step(
            index,
            AggregateStep::LocalGroupAggregate,
            attrs,
            vec!["I"],
        ));
    }
    let distribution = if keys.is_empty() {
        "single".to_string()
    } else {
        format!("hash[{}]", keys.join(", "))
    };
    nodes.push(PlanNode::step(
        index,
        AggregateStep::Exchange,
        vec![format!("distribution=[{distribution}]")],
        if two_phase { vec!["I"] } else { in_mode },
    ));
    // -U rows, unless the plan lets the last aggregate drop them (`settle_update_before`).
    let mut out_mode = vec!["I", "UB", "UA"];
    if changelog {
        out_mode.push("D");
    }
    let mut attrs: Vec<String> = group_by.iter().cloned().collect();
    attrs.extend(partial_final);
    attrs.push(format!(
        "select=[{}]",
        if two_phase { &global_select } else { &select }.join(", ")
    ));
    nodes.push(PlanNode::step(
        index,
        AggregateStep::keyed(two_phase),
        attrs,
        out_mode,
    ));
    Ok(AggregateNodes {
        nodes,
        names,
        keys,
        has_distinct,
        distinct_args,
    })
}

/// How EXPLAIN's strategy notes and warnings name an aggregate:
/// `GroupAggregate(groupBy=[k])`, `GlobalGroupAggregate(groupBy=[k])`, or the name alone.
pub(super) fn aggregate_label(two_phase: bool, group_expr: &[Expr]) -> String {
    let name = if two_phase {
        "GlobalGroupAggregate"
    } else {
        "GroupAggregate"
    };
    if group_expr.is_empty() {
        return name.to_string();
    }
    let keys: Vec<String> = group_expr.iter().map(show).collect();
    format!("{name}(groupBy=[{}])", keys.join(", "))
}

/// An expression in Flink's explain style: unqualified columns, SQL literals, upper-case
/// function names.
pub fn show(e: &Expr) -> String {
    show_in(e, &HashMap::new())
}

/// [`show`], naming columns by `names` where it has them.
pub(super) fn show_in(e: &Expr, names: &HashMap<String, String>) -> String {
    let show = |e: &Expr| show_in(e, names);
    match e {
        Expr::Column(c) => names
            .get(&c.name)
            .cloned()
            .unwrap_or_else(|| c.name.clone()),
        Expr::Alias(Alias { expr, .. }) => show(expr),
        Expr::Literal(v, _) => match v {
            ScalarValue::Utf8(Some(s))
            | ScalarValue::LargeUtf8(Some(s))
            | ScalarValue::Utf8View(Some(s)) => {
                format!("'{}'", s.replace('\'', "''"))
            }
            v if v.is_null() => "null".to_string(),
            v => v.to_string(),
        },
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            format!("({} {op} {})", show(left), show(right))
        }
        Expr::Not(x) => format!("NOT({})", show(x)),
        Expr::IsNull(x) => format!("{} IS NULL", show(x)),
        Expr::IsNotNull(x) => format!("{} IS NOT NULL", show(x)),
        Expr::IsTrue(x) => format!("{} IS TRUE", show(x)),
        Expr::Negative(x) => format!("-({})", show(x)),
        Expr::Cast(c) => format!("CAST({} AS {})", show(&c.expr), c.field.data_type()),
        Expr::TryCast(c) => format!("TRY_CAST({} AS {})", show(&c.expr), c.field.data_type()),
        Expr::ScalarFunction(ScalarFunction { func, args })
            if func.name() == crate::sql::split_functions::BUCKET_FUNCTION =>
        {
            let n = crate::sql::split_functions::bucket_count(func).unwrap_or(0);
            let arg = args.first().map(&show).unwrap_or_default();
            format!("MOD(HASH_CODE({arg}), {n})")
        }
        Expr::ScalarFunction(ScalarFunction { func, args })
            if func.name() == crate::sql::split_functions::AVG_FINAL_FUNCTION
                && args.len() == 2 =>
        {
            let (s, c) = (show(&args[0]), show(&args[1]));
            format!("IF(({c} = 0), null, ({s} / {c}))")
        }
        Expr::ScalarFunction(ScalarFunction { func, args }) => {
            let args: Vec<String> = args.iter().map(&show).collect();
            format!("{}({})", func.name().to_ascii_uppercase(), args.join(", "))
        }
        Expr::Case(c) => {
            let mut s = String::from("CASE(");
            let mut parts = vec![];
            if let Some(x) = &c.expr {
                parts.push(show(x));
            }
            for (w, t) in &c.when_then_expr {
                parts.push(show(w));
                parts.push(show(t));
            }
            if let Some(x) = &c.else_expr {
                parts.push(show(x));
            }
            s.push_str(&parts.join(", "));
            s.push(')');
            s
        }
        other => other.to_string(),
    }
}

/// An expression with its output name (`expr AS name` unless it is that column).
pub(super) fn show_named(e: &Expr, names: &HashMap<String, String>) -> String {
    match e {
        Expr::Alias(Alias { expr, name, .. }) => {
            let mut expr = expr.as_ref();
            while let Expr::Alias(Alias { expr: inner, .. }) = expr {
                expr = inner.as_ref();
            }
            let s = show_in(expr, names);
            if &s == name {
                s
            } else {
                format!("{s} AS {name}")
            }
        }
        other => show_in(other, names),
    }
}
