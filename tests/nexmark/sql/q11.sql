-- q11, user sessions (Flink nexmark q11): SESSION(dateTime, 10 s) per
-- bidder, written out: a bid more than 10 s after the bidder's previous one
-- opens a session (Flink merges windows that touch); a session ends 10 s
-- after its last bid.
WITH flagged AS (
    SELECT bidder, date_time,
        CASE WHEN date_time - lag(date_time) OVER w <= 10000 THEN 0 ELSE 1 END AS opens
    FROM bid
    WINDOW w AS (PARTITION BY bidder ORDER BY date_time, auction, price, channel, url, extra)
),
numbered AS (
    SELECT bidder, date_time,
        sum(opens) OVER (
            PARTITION BY bidder ORDER BY date_time, opens DESC
            ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW
        ) AS session
    FROM flagged
)
SELECT bidder, count(*), min(date_time), max(date_time) + 10000
FROM numbered
GROUP BY bidder, session;
