-- q16, channel statistics report (Flink nexmark q16), days and minutes in
-- UTC.
SELECT struct_pack(
    channel := channel,
    day := strftime(epoch_ms(date_time::BIGINT), '%Y-%m-%d'),
    minute := max(strftime(epoch_ms(date_time::BIGINT), '%H:%M')),
    total_bids := count(*),
    rank1_bids := count(*) FILTER (WHERE price < 10000),
    rank2_bids := count(*) FILTER (WHERE price >= 10000 AND price < 1000000),
    rank3_bids := count(*) FILTER (WHERE price >= 1000000),
    total_bidders := count(DISTINCT bidder),
    rank1_bidders := count(DISTINCT bidder) FILTER (WHERE price < 10000),
    rank2_bidders := count(DISTINCT bidder) FILTER (WHERE price >= 10000 AND price < 1000000),
    rank3_bidders := count(DISTINCT bidder) FILTER (WHERE price >= 1000000),
    total_auctions := count(DISTINCT auction),
    rank1_auctions := count(DISTINCT auction) FILTER (WHERE price < 10000),
    rank2_auctions := count(DISTINCT auction) FILTER (WHERE price >= 10000 AND price < 1000000),
    rank3_auctions := count(DISTINCT auction) FILTER (WHERE price >= 1000000)
)
FROM bid
GROUP BY channel, strftime(epoch_ms(date_time::BIGINT), '%Y-%m-%d');
