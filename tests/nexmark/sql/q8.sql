-- q8, monitor new users (Flink nexmark q8), 10-second tumbling windows.
SELECT P.id, P.name, P.starttime
FROM (
    SELECT id, name, (date_time // 10000) * 10000 AS starttime
    FROM person GROUP BY id, name, starttime
) P
JOIN (
    SELECT seller, (date_time // 10000) * 10000 AS starttime
    FROM auction GROUP BY seller, starttime
) A
ON P.id = A.seller AND P.starttime = A.starttime;
