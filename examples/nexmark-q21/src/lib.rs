//! Nexmark q21, add channel id: the bids that name a channel, as
//! `(auction, bidder, price, channel, channel id)`. The four big channels
//! have the ids `"0"`–`"3"`; any other channel's id is the URL's
//! `channel_id` parameter, and a bid with neither is left out.
//!
//! Follows the Flink nexmark SQL (`CASE lower(channel) WHEN 'apple' THEN
//! '0' … ELSE REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2) END`),
//! with the regular expression written out as string functions.

use nexmark_model::BidWithUrl;
use sluice_guest::Circuit;

/// The value of the `channel_id` parameter of `url`: after `channel_id=`
/// at the start or after a `&`, up to the next `&`.
pub fn channel_id_param(url: &str) -> Option<&str> {
    let mut from = 0;
    while let Some(at) = url[from..].find("channel_id=") {
        let at = from + at;
        if at == 0 || url.as_bytes()[at - 1] == b'&' {
            let value = &url[at + "channel_id=".len()..];
            return Some(value.split('&').next().unwrap_or(value));
        }
        from = at + 1;
    }
    None
}

/// The channel's id: the four big channels' own, else the URL's.
pub fn channel_id(b: &BidWithUrl) -> Option<String> {
    let id = match b.channel.to_lowercase().as_str() {
        "apple" => "0",
        "google" => "1",
        "facebook" => "2",
        "baidu" => "3",
        _ => return channel_id_param(&b.url).map(str::to_owned),
    };
    Some(id.to_owned())
}

/// Builds the circuit.
pub fn build(c: &mut Circuit) {
    // Read without the time and padding: the decoder skips them.
    c.input::<BidWithUrl>("bid")
        .filter_map(|b| {
            channel_id(b).map(|id| (b.auction, b.bidder, b.price, b.channel.clone(), id))
        })
        .output("channel_ids");
}

sluice_guest::circuit!(build);
