-- q17, auction statistics report (Flink nexmark q17), days in UTC.
SELECT
    auction,
    strftime(epoch_ms(date_time::BIGINT), '%Y-%m-%d') AS day,
    count(*) AS total_bids,
    count(*) FILTER (WHERE price < 10000) AS rank1_bids,
    count(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids,
    count(*) FILTER (WHERE price >= 1000000) AS rank3_bids,
    min(price) AS min_price,
    max(price) AS max_price,
    avg(price) AS avg_price,
    sum(price)::UBIGINT AS sum_price
FROM bid
GROUP BY auction, day;
