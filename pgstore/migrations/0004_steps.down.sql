DROP TABLE {{.Steps}};
ALTER TABLE {{.Keys}} DROP COLUMN step_count, DROP COLUMN steps;
