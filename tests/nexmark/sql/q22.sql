-- q22, get URL directories (Flink nexmark q22): SPLIT_INDEX(url, '/', n)
-- counts from 0 and is NULL past the end; DuckDB's lists count from 1.
SELECT auction, bidder, price, channel,
    string_split(url, '/')[4] AS dir1,
    string_split(url, '/')[5] AS dir2,
    string_split(url, '/')[6] AS dir3
FROM bid;
