DROP TABLE {{.Webhooks}};
