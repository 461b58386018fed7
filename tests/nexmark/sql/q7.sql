-- q7, highest bid (Flink nexmark q7): the bids with the highest price of
-- their 10-second tumbling window, with the window's start.
WITH windowed AS (SELECT (date_time // 10000) * 10000 AS starttime, * FROM bid)
SELECT W.starttime, W.auction, W.price, W.bidder, W.date_time
FROM windowed W
JOIN (SELECT starttime, max(price) AS maxprice FROM windowed GROUP BY starttime) M
  ON W.starttime = M.starttime AND W.price = M.maxprice;
