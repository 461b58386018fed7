-- q3, local item suggestion (Flink nexmark q3; states are lower-case in
-- the generated data).
SELECT P.name, P.city, P.state, A.id
FROM auction AS A JOIN person AS P ON A.seller = P.id
WHERE A.category = 10 AND (P.state = 'or' OR P.state = 'id' OR P.state = 'ca');
