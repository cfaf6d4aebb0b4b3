DROP TABLE {{.Consumed}};
