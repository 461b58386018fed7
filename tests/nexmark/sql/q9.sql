-- q9, winning bids (Flink nexmark q9). Ties of price and time, which
-- Flink leaves to chance, go to the smallest bid by its fields in order
-- (as the circuit decides them).
SELECT A, B
FROM (
    SELECT A, B, ROW_NUMBER() OVER (
        PARTITION BY A.id
        ORDER BY B.price DESC, B.date_time ASC, B.bidder ASC, B.channel ASC, B.url ASC, B.extra ASC
    ) AS rownum
    FROM auction A, bid B
    WHERE A.id = B.auction AND B.date_time BETWEEN A.date_time AND A.expires
)
WHERE rownum <= 1;
