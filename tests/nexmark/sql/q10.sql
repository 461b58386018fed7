-- q10, log to file system (Flink nexmark q10), days and minutes in UTC.
SELECT auction, bidder, price, date_time, extra,
    strftime(epoch_ms(date_time::BIGINT), '%Y-%m-%d'),
    strftime(epoch_ms(date_time::BIGINT), '%H:%M')
FROM bid;
