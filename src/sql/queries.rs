//! Built-in benchmark queries: the orders set and Nexmark q15, q16, q17.
//!
//! Each is a SELECT over one table: `orders` (the columns of `tally gen orders`) or `bid` (the
//! columns of `tally gen nexmark`).

/// A built-in query: its name, the table it reads, what it measures, and its SQL.
#[derive(Debug, Clone, Copy)]
pub struct Builtin {
    /// The name `tally bench --query` takes.
    pub name: &'static str,
    /// The table the query reads.
    pub table: &'static str,
    /// One line on what it measures.
    pub about: &'static str,
    /// The SELECT.
    pub sql: &'static str,
}

/// The thirteen counts Nexmark q15 and q16 share.
macro_rules! ranks {
    () => {
        "COUNT(*) AS total_bids,
    COUNT(*) FILTER (WHERE price < 10000) AS rank1_bids,
    COUNT(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids,
    COUNT(*) FILTER (WHERE price >= 1000000) AS rank3_bids,
    COUNT(DISTINCT bidder) AS total_bidders,
    COUNT(DISTINCT bidder) FILTER (WHERE price < 10000) AS rank1_bidders,
    COUNT(DISTINCT bidder) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bidders,
    COUNT(DISTINCT bidder) FILTER (WHERE price >= 1000000) AS rank3_bidders,
    COUNT(DISTINCT auction) AS total_auctions,
    COUNT(DISTINCT auction) FILTER (WHERE price < 10000) AS rank1_auctions,
    COUNT(DISTINCT auction) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_auctions,
    COUNT(DISTINCT auction) FILTER (WHERE price >= 1000000) AS rank3_auctions"
    };
}

/// Every built-in query.
pub const BUILTINS: &[Builtin] = &[
    Builtin {
        name: "orders-count",
        table: "orders",
        about: "COUNT, SUM and a FILTERed SUM by shop (the hot key)",
        sql: "SELECT shop, COUNT(*) AS orders, SUM(amount) AS total, \
              SUM(amount) FILTER (WHERE status = 'PAID') AS paid FROM orders GROUP BY shop",
    },
    Builtin {
        name: "orders-distinct",
        table: "orders",
        about: "COUNT(DISTINCT user_id) by shop",
        sql: "SELECT shop, COUNT(DISTINCT user_id) AS buyers FROM orders GROUP BY shop",
    },
    Builtin {
        name: "q15",
        table: "bid",
        about: "Nexmark q15: bids, bidders and auctions per day by price range",
        sql: concat!(
            "SELECT DATE_FORMAT(dateTime, 'yyyy-MM-dd') AS `day`, ",
            ranks!(),
            " FROM bid GROUP BY DATE_FORMAT(dateTime, 'yyyy-MM-dd')"
        ),
    },
    Builtin {
        name: "q16",
        table: "bid",
        about: "Nexmark q16: q15 per channel and day, with the last minute seen",
        sql: concat!(
            "SELECT channel, DATE_FORMAT(dateTime, 'yyyy-MM-dd') AS `day`, ",
            "MAX(DATE_FORMAT(dateTime, 'HH:mm')) AS `minute`, ",
            ranks!(),
            " FROM bid GROUP BY channel, DATE_FORMAT(dateTime, 'yyyy-MM-dd')"
        ),
    },
    Builtin {
        name: "q17",
        table: "bid",
        about: "Nexmark q17: per auction and day, bid counts by price range and price statistics",
        sql: "SELECT auction, DATE_FORMAT(dateTime, 'yyyy-MM-dd') AS `day`, \
              COUNT(*) AS total_bids, \
              COUNT(*) FILTER (WHERE price < 10000) AS rank1_bids, \
              COUNT(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids, \
              COUNT(*) FILTER (WHERE price >= 1000000) AS rank3_bids, \
              MIN(price) AS min_price, MAX(price) AS max_price, AVG(price) AS avg_price, \
              SUM(price) AS sum_price \
              FROM bid GROUP BY auction, DATE_FORMAT(dateTime, 'yyyy-MM-dd')",
    },
];

/// The built-in query named `name`.
pub fn builtin(name: &str) -> Option<&'static Builtin> {
    BUILTINS.iter().find(|b| b.name.eq_ignore_ascii_case(name))
}
