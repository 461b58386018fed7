//! Revenue per region: orders joined with customers on the customer id,
//! summed per region. Input ports `orders` (`{"id", "customer", "amount"}`)
//! and `customers` (`{"id", "name", "region"}`); output `revenue`
//! (`{"region", "revenue"}`). Moving a customer to another region moves
//! their revenue with them.

use sluice_guest::prelude::*;

/// An order of `amount` cents by `customer`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Order {
    /// Order id.
    pub id: u64,
    /// Customer id.
    pub customer: u64,
    /// Amount in cents.
    pub amount: i64,
}

/// A customer and the region they are in.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Customer {
    /// Customer id.
    pub id: u64,
    /// Name.
    pub name: String,
    /// Sales region.
    pub region: String,
}

/// Revenue of one region.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Revenue {
    /// The region.
    pub region: String,
    /// Sum of its customers' order amounts.
    pub revenue: i64,
}

/// Builds the circuit.
pub fn build(c: &mut Circuit) {
    let customers = c.input::<Customer>("customers").key_by(|c| c.id);
    c.input::<Order>("orders")
        .key_by(|o| o.customer)
        .join(&customers, |_, o, c| (c.region.clone(), o.amount))
        .sum_by(|(region, _)| region.clone(), |(_, amount)| *amount)
        .map(|(region, revenue)| Revenue {
            region: region.clone(),
            revenue: *revenue,
        })
        .output("revenue");
}

sluice_guest::circuit!(build);
