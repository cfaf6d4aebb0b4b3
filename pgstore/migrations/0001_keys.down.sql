DROP TABLE {{.Keys}};
