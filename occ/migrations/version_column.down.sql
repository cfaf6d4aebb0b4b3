ALTER TABLE {{.Table}} DROP COLUMN {{.Column}};
