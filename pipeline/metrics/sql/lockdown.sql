-- For user queries (pipeline.metrics.cohorts.sql): after the views exist, files may be read only under the
-- run's own prefix, and no setting can be changed back.
SET allowed_directories = getvariable('allowed_directories');
SET enable_external_access = false;
SET autoinstall_known_extensions = false;
SET lock_configuration = true;
