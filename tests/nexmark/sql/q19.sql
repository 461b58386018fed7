-- q19, auction top-10 price (Flink nexmark q19), without the row number.
-- Equal prices, which Flink leaves to chance, go to the largest bid by its
-- fields in order.
SELECT struct_pack(auction, bidder, price, channel, url, date_time, extra)
FROM (
    SELECT *, ROW_NUMBER() OVER (
        PARTITION BY auction
        ORDER BY price DESC, bidder DESC, channel DESC, url DESC, date_time DESC, extra DESC
    ) AS rank_number
    FROM bid
)
WHERE rank_number <= 10;
