-- q18, find last bid (Flink nexmark q18). Bids at the same time, which
-- Flink leaves to chance, go to the largest bid by its fields in order.
SELECT struct_pack(auction, bidder, price, channel, url, date_time, extra)
FROM (
    SELECT *, ROW_NUMBER() OVER (
        PARTITION BY bidder, auction
        ORDER BY date_time DESC, price DESC, channel DESC, url DESC, extra DESC
    ) AS rank_number
    FROM bid
)
WHERE rank_number <= 1;
