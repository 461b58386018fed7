-- q21, add channel id (Flink nexmark q21). DuckDB's regexp_extract gives
-- '' where Flink's REGEXP_EXTRACT gives NULL (no match): regexp_matches
-- tells the two apart.
SELECT auction, bidder, price, channel, channel_id
FROM (
    SELECT *,
        CASE
            WHEN lower(channel) = 'apple' THEN '0'
            WHEN lower(channel) = 'google' THEN '1'
            WHEN lower(channel) = 'facebook' THEN '2'
            WHEN lower(channel) = 'baidu' THEN '3'
            WHEN regexp_matches(url, '(&|^)channel_id=([^&]*)')
                THEN regexp_extract(url, '(&|^)channel_id=([^&]*)', 2)
        END AS channel_id
    FROM bid
)
WHERE channel_id IS NOT NULL;
