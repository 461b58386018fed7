-- q14, calculation (Flink nexmark q14), hours in UTC; count_char is
-- written as a length difference.
SELECT auction, bidder, (0.908 * price)::DOUBLE,
    CASE
        WHEN hour(epoch_ms(date_time::BIGINT)) >= 8 AND hour(epoch_ms(date_time::BIGINT)) <= 18 THEN 'dayTime'
        WHEN hour(epoch_ms(date_time::BIGINT)) <= 6 OR hour(epoch_ms(date_time::BIGINT)) >= 20 THEN 'nightTime'
        ELSE 'otherTime'
    END,
    date_time, extra, length(extra) - length(replace(extra, 'c', ''))
FROM bid
WHERE 0.908 * price > 1000000 AND 0.908 * price < 50000000;
