-- Run once by the postgres image, as POSTGRES_USER, when its data volume is first created:
-- one database per server, both owned by that user.
CREATE DATABASE mlflow;
CREATE DATABASE prefect;
