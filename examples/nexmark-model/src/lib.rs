//! The Nexmark benchmark's records, as `sluice gen nexmark` writes them (one
//! JSON object per line in `person.jsonl`, `auction.jsonl`, `bid.jsonl`).
//! Times are milliseconds since the epoch; states are lower-case.

use serde::{Deserialize, Serialize};

/// Someone who sells or bids.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Person {
    /// Unique id.
    pub id: u64,
    /// Full name.
    pub name: String,
    /// E-mail address.
    pub email_address: String,
    /// Credit card number.
    pub credit_card: String,
    /// City.
    pub city: String,
    /// US state, lower-case (`"or"`, `"id"`, `"ca"`, …).
    pub state: String,
    /// When the person registered.
    pub date_time: u64,
    /// Padding.
    pub extra: String,
}

/// An item for sale.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Auction {
    /// Unique id.
    pub id: u64,
    /// Item name.
    pub item_name: String,
    /// Item description.
    pub description: String,
    /// Starting price.
    pub initial_bid: u64,
    /// Reserve price.
    pub reserve: u64,
    /// When the auction opened.
    pub date_time: u64,
    /// When it closes.
    pub expires: u64,
    /// The seller's person id.
    pub seller: u64,
    /// Category id.
    pub category: u64,
    /// Padding.
    pub extra: String,
}

/// A bid on an auction.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Bid {
    /// The auction's id.
    pub auction: u64,
    /// The bidder's person id.
    pub bidder: u64,
    /// Price in cents.
    pub price: u64,
    /// Channel the bid came through.
    pub channel: String,
    /// Referring URL.
    pub url: String,
    /// When the bid was placed.
    pub date_time: u64,
    /// Padding.
    pub extra: String,
}
