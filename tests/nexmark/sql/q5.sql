-- q5, hot items (Flink nexmark q5): HOP(bid, 2 s slide, 10 s size), the
-- windows written out: a bid at t is in the windows starting at the
-- multiples of 2 000 in (t - 10 000, t]. The window start is in the output.
WITH windowed AS (
    SELECT (B.date_time // 2000) * 2000 - k * 2000 AS starttime, B.auction
    FROM bid B, range(0, 5) AS r(k)
    WHERE (B.date_time // 2000) * 2000 - k * 2000 + 10000 > B.date_time
),
AuctionBids AS (
    SELECT auction, count(*) AS num, starttime FROM windowed GROUP BY auction, starttime
),
MaxBids AS (
    SELECT max(num) AS maxn, starttime FROM AuctionBids GROUP BY starttime
)
SELECT A.starttime, A.auction, A.num
FROM AuctionBids A JOIN MaxBids M ON A.starttime = M.starttime AND A.num >= M.maxn;
