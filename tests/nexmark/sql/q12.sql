-- q12, bids per bidder per 10-second window: Flink's windows are over
-- processing time; the circuit's (and these) are over event time.
SELECT bidder, count(*), (date_time // 10000) * 10000 AS starttime, (date_time // 10000) * 10000 + 10000
FROM bid
GROUP BY bidder, starttime;
