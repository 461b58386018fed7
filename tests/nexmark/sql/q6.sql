-- q6, average selling price by seller: the average final price of each
-- seller's last ten auctions (by closing time, then id). Flink's text for
-- q6 is marked unsupported; this is the Nexmark definition.
WITH winners AS (
    SELECT A.id, A.seller, A.expires, max(B.price) AS final
    FROM auction A JOIN bid B
      ON A.id = B.auction AND B.date_time BETWEEN A.date_time AND A.expires
    GROUP BY A.id, A.seller, A.expires
),
ranked AS (
    SELECT *, ROW_NUMBER() OVER (PARTITION BY seller ORDER BY expires DESC, id DESC) AS rn
    FROM winners
)
SELECT seller, avg(final) FROM ranked WHERE rn <= 10 GROUP BY seller;
