//! The catalog: the tables a session created, and what DataFusion's SQL planner may look up
//! (tables, functions, options) while a query is planned.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow::datatypes::DataType;
use datafusion_common::TableReference;
use datafusion_common::config::ConfigOptions;
use datafusion_expr::logical_plan::LogicalTableSource;
use datafusion_expr::planner::{ContextProvider, ExprPlanner};
use datafusion_expr::{AggregateUDF, HigherOrderUDF, ScalarUDF, TableSource, WindowUDF};

use crate::source::FileTable;

/// The tables created so far, by name.
#[derive(Debug, Default, Clone)]
pub struct Catalog {
    tables: BTreeMap<String, FileTable>,
}

impl Catalog {
    /// The table named `name`.
    pub fn table(&self, name: &str) -> Option<&FileTable> {
        self.tables.get(name)
    }

    /// Adds a table; false when one of that name exists (nothing changes then).
    pub fn add(&mut self, table: FileTable) -> bool {
        if self.tables.contains_key(&table.name) {
            return false;
        }
        self.tables.insert(table.name.clone(), table);
        true
    }

    /// What DataFusion's SQL planner looks up: these tables, the functions, default options.
    pub(crate) fn provider(&self) -> impl ContextProvider + '_ {
        Provider::new(&self.tables)
    }
}

/// Tables, functions and options for DataFusion's SQL planner.
struct Provider {
    tables: HashMap<String, Arc<dyn TableSource>>,
    scalars: HashMap<String, Arc<ScalarUDF>>,
    aggregates: HashMap<String, Arc<AggregateUDF>>,
    planners: Vec<Arc<dyn ExprPlanner>>,
    options: ConfigOptions,
}

impl Provider {
    fn new(tables: &BTreeMap<String, FileTable>) -> Self {
        let mut scalars = HashMap::new();
        for f in datafusion_functions::all_default_functions()
            .into_iter()
            .chain(super::flink_functions::flink_udfs())
        {
            for alias in f.aliases() {
                scalars.insert(alias.to_ascii_lowercase(), Arc::clone(&f));
            }
            scalars.insert(f.name().to_ascii_lowercase(), f);
        }
        let aggregates = crate::aggregates::all_udafs()
            .into_iter()
            .map(|f| (f.name().to_ascii_lowercase(), f))
            .collect();
        Self {
            tables: tables
                .iter()
                .map(|(n, t)| {
                    (
                        n.clone(),
                        Arc::new(LogicalTableSource::new(Arc::clone(&t.schema)))
                            as Arc<dyn TableSource>,
                    )
                })
                .collect(),
            scalars,
            aggregates,
            planners: vec![
                Arc::new(super::cast_names::CastArgNames),
                Arc::new(datafusion_functions_aggregate::planner::AggregateFunctionPlanner),
                Arc::new(datafusion_functions::core::planner::CoreFunctionPlanner::default()),
                Arc::new(datafusion_functions::unicode::planner::UnicodeFunctionPlanner),
                Arc::new(datafusion_functions::datetime::planner::DatetimeFunctionPlanner),
            ],
            options: ConfigOptions::default(),
        }
    }
}

impl ContextProvider for Provider {
    fn get_table_source(
        &self,
        name: TableReference,
    ) -> datafusion_common::Result<Arc<dyn TableSource>> {
        self.tables.get(name.table()).cloned().ok_or_else(|| {
            datafusion_common::DataFusionError::Plan(format!(
                "table '{}' not found (create it with CREATE TABLE … WITH ('connector' = 'filesystem', …))",
                name.table()
            ))
        })
    }
    fn get_expr_planners(&self) -> &[Arc<dyn ExprPlanner>] {
        &self.planners
    }
    fn get_function_meta(&self, name: &str) -> Option<Arc<ScalarUDF>> {
        self.scalars.get(&name.to_ascii_lowercase()).cloned()
    }
    fn get_higher_order_meta(&self, _name: &str) -> Option<Arc<HigherOrderUDF>> {
        None
    }
    fn get_aggregate_meta(&self, name: &str) -> Option<Arc<AggregateUDF>> {
        self.aggregates.get(&name.to_ascii_lowercase()).cloned()
    }
    fn get_window_meta(&self, _name: &str) -> Option<Arc<WindowUDF>> {
        None
    }
    fn get_variable_type(&self, _names: &[String]) -> Option<DataType> {
        None
    }
    fn options(&self) -> &ConfigOptions {
        &self.options
    }
    fn udf_names(&self) -> Vec<String> {
        self.scalars.keys().cloned().collect()
    }
    fn higher_order_function_names(&self) -> Vec<String> {
        vec![]
    }
    fn udaf_names(&self) -> Vec<String> {
        self.aggregates.keys().cloned().collect()
    }
    fn udwf_names(&self) -> Vec<String> {
        vec![]
    }
}
