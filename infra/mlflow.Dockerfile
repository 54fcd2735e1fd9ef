# The MLflow tracking server of infra/docker-compose.yml: MLflow + a PostgreSQL driver + boto3
# for an S3 artifact store (MinIO or AWS). These versions ran together against PostgreSQL 15 and
# an S3-compatible server on the machine that wrote this file (see infra/README.md); the image
# itself was not built there (no Docker daemon).
FROM python:3.11-slim

ARG MLFLOW_VERSION=3.17.2
RUN pip install --no-cache-dir \
        "mlflow==${MLFLOW_VERSION}" \
        "psycopg[binary]==3.3.9" \
        "boto3==1.44.8" \
    && useradd --create-home --uid 1000 mlflow

# SQLAlchemy 2.1 maps a bare postgresql:// to psycopg 3; the compose file names the driver
# explicitly (postgresql+psycopg://) so the URI means the same under any SQLAlchemy 2.x.
ENV MLFLOW_DISABLE_TELEMETRY=true \
    DO_NOT_TRACK=1
USER mlflow
WORKDIR /home/mlflow
EXPOSE 5000
CMD ["mlflow", "server", "--help"]
